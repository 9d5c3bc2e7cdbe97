"""The arguments of ``manage.py jobs``: one subparser per subcommand, shared
groups of options (output, filters, acting), and usage errors as exit status 2."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import CommandError, CommandParser

from jobs.cli import EXIT_USAGE
from jobs.cli.console import to_json
from jobs.cli.control import PAUSE, RESUME
from jobs.ledger import operations, states

DESCRIPTIONS = {
    "status": """\
Queues (waiting, delayed, dead-lettered, paused, age of the oldest waiting
message), live worker processes with the jobs each runs, the ledger's counts
by state (all time and the last hour) and stale running jobs: rows still
"running" whose worker has no heartbeat any more (the watchdog reconciles
them every minute).""",
    "failed": """\
Failed jobs, newest first: ledger id, message id, actor, queue, attempts,
when it finished and the last error. "failed for good" marks a permanent
failure (a PermanentJobError such as InvalidPayload): never retried by the
worker, and failing again if retried unchanged. Exit status 1 when none
matches.""",
    "retry": """\
Send failed jobs again as new messages linked to the original (as the
admin's "Retry" action; each failed job is retried once). Choose them by ids
or by filters; with neither, --all is required. Counts the matches, then asks
for confirmation unless --yes (without a terminal, --yes is required). Jobs
that failed for good are left alone and counted unless --include-permanent.

examples:
  manage.py jobs retry 4711 0b6c2a3e-5d1f-4c7e-9a0b-2f1e3d4c5b6a
  manage.py jobs retry --actor send_welcome_email --since 2026-12-01T08:00
  manage.py jobs retry --search auth.user:7 --dry-run
  manage.py jobs retry --all --yes --json""",
    "cancel": """\
Cancel jobs that have not ended, as the admin's "Cancel" action. Waiting ones
(enqueued, delayed) are cancelled at once: workers skip them. Running ones are
asked to stop: the job sees it at its next check (a checkpoint, a progress
report, cancellation.check()) or is stopped by force after
JOBS_CANCEL_GRACE_MS. Both end "cancelled", with who asked. Finished jobs are
left alone (too late). Choose them by ids or by filters;
with neither, --all is required. Counts the matches, then asks for
confirmation unless --yes (without a terminal, --yes is required).

examples:
  manage.py jobs cancel --queue emails --state delayed
  manage.py jobs cancel --search auth.user:7 --yes""",
    "schedules": """\
The periodic jobs as the schedulers follow them: the cron (and the code's when
an operator overrode it), on or off, the next and the last run. With an
ACTOR and one of --cron, --enable, --disable, --reset, changes that schedule
as the admin's Schedules page does (from the schedulers' next minute; an
audit entry as os:<user>).

examples:
  manage.py jobs schedules
  manage.py jobs schedules daily_report --cron "30 5 * * *"
  manage.py jobs schedules watchdog --disable
  manage.py jobs schedules daily_report --reset""",
    "audit": """\
The audit trail, newest first: every operator action from the admin or this
command (retry, cancel, delete, pause, resume, schedule changes, run now), who
did it, on what and how many jobs. --job lists the entries naming one job.""",
    "unwind-fair": """\
Move the jobs of fair queues' key lists (actors with a fairness_key) back into
their queues as plain messages, a key at a time in turn order, a thousand jobs
per Redis call. Needed only before rolling back to a release without fair
queueing, whose workers do not read key lists: first run every process with
JOBS_FAIR_QUEUEING = False, so that none sends into them any more. A name no
actor declares is an error that lists the known queues; --all takes every
queue that has key lists in Redis, including one no actor declares any more.

examples:
  manage.py jobs unwind-fair reports
  manage.py jobs unwind-fair --all""",
    "pause": """\
Pause queues: workers leave their messages waiting (put back with a delay)
until the queue is resumed. Takes effect within JOBS_CONTROL_REFRESH_MS.
A name no actor declares is an error that lists the known queues.""",
    "resume": """\
Resume paused queues: their waiting messages run again. A paused queue that
no actor declares any more can be resumed too.""",
}
# Django's own options, accepted after the subcommand as well (``jobs retry
# --yes -v 0``): argparse would otherwise reject them there. SUPPRESS keeps a
# value given before the subcommand from being overwritten by a default.
DJANGO_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("-v", "--verbosity"), {"type": int, "choices": [0, 1, 2, 3]}),
    (("--settings",), {}),
    (("--pythonpath",), {}),
    (("--traceback",), {"action": "store_true"}),
    (("--no-color",), {"action": "store_true"}),
    (("--force-color",), {"action": "store_true"}),
    (("--skip-checks",), {"action": "store_true"}),
)


class SubcommandParser(CommandParser):
    """A subcommand's parser: a usage error is exit status 2 from ``call_command``
    too, and is also a JSON document on stdout when the command line has --json."""

    def error(self, message: str) -> Any:
        if not self.called_from_command_line:
            raise CommandError(f"Error: {message}", returncode=EXIT_USAGE)
        if "--json" in sys.argv:
            sys.stdout.write(to_json({"error": message}) + "\n")
        super().error(message)  # usage and message on stderr, exit status 2


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _common() -> SubcommandParser:
    common = SubcommandParser(add_help=False)
    common.add_argument(
        "--json",
        action="store_true",
        help='print one JSON document on stdout and nothing else (errors as {"error": ...})',
    )
    for flags, kwargs in DJANGO_OPTIONS:
        common.add_argument(*flags, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
    return common


def _filters(*, states_: tuple[str, ...] = ()) -> SubcommandParser:
    filters = SubcommandParser(add_help=False)
    group = filters.add_argument_group("filters (as the admin's job list; all must hold)")
    group.add_argument("--actor", metavar="NAME", help="actor name, exactly")
    group.add_argument("--queue", metavar="NAME", help="queue name, exactly")
    if states_:
        group.add_argument("--state", choices=states_, help="only jobs in this state")
    group.add_argument(
        "--since",
        metavar="WHEN",
        help="enqueued at or after WHEN: ISO date or datetime, TIME_ZONE unless it has an offset",
    )
    group.add_argument("--until", metavar="WHEN", help="enqueued before WHEN (as --since)")
    group.add_argument(
        "--search",
        metavar="TEXT",
        help="as the admin's search box: a message id or an object such as auth.user:7 (any "
        "age), an argument such as user_id=7 (any age if the actor declares it in search_by), "
        "else each word in the actor name or arguments of the newest 100,000 jobs",
    )
    return filters


def _acting() -> SubcommandParser:
    acting = SubcommandParser(add_help=False)
    acting.add_argument(
        "ids",
        nargs="*",
        metavar="ID",
        help="ledger ids (the number in the admin's URL) or message ids (UUIDs); not with filters",
    )
    acting.add_argument("--all", action="store_true", help="act on every job when no id or filter")
    acting.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    acting.add_argument("--dry-run", action="store_true", help="count the matches, do nothing")
    acting.add_argument(
        "--batch",
        type=positive_int,
        default=operations.BATCH,
        metavar="N",
        help="jobs per batch; a progress line on stderr after each (default: %(default)s)",
    )
    return acting


def add_subcommands(parser: CommandParser) -> None:
    subcommands = parser.add_subparsers(
        dest="subcommand",
        required=True,
        metavar="SUBCOMMAND",
        title="subcommands",
        parser_class=SubcommandParser,
    )

    def add(name: str, summary: str, *parents: SubcommandParser) -> CommandParser:
        sub: CommandParser = subcommands.add_parser(
            name,
            help=summary,
            description=DESCRIPTIONS[name],
            parents=[_common(), *parents],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return sub

    add("status", "queues, workers, ledger counts, stale running jobs")
    failed = add("failed", "list failed jobs, newest first", _filters())
    failed.add_argument(
        "--limit",
        type=positive_int,
        default=20,
        metavar="N",
        help="at most this many (default: %(default)s)",
    )
    retry = add("retry", "retry failed jobs by id or filter", _acting(), _filters())
    retry.add_argument(
        "--include-permanent",
        action="store_true",
        help="also retry jobs that failed for good (PermanentJobError, InvalidPayload)",
    )
    live = (states.ENQUEUED, states.DELAYED, states.RUNNING)
    summary = "cancel waiting or running jobs by id or filter"
    add("cancel", summary, _acting(), _filters(states_=live))
    schedules = add("schedules", "list periodic jobs, or change one's schedule")
    schedules.add_argument("actor", nargs="?", metavar="ACTOR", help="the periodic job to change")
    change = schedules.add_mutually_exclusive_group()
    change.add_argument("--cron", metavar="SPEC", help='a new cron, e.g. "30 5 * * *"')
    change.add_argument("--enable", action="store_true", help="switch it on")
    change.add_argument("--disable", action="store_true", help="switch it off")
    change.add_argument("--reset", action="store_true", help="back to the code's schedule")
    trail = add("audit", "the audit trail of operator actions")
    trail.add_argument(
        "--limit",
        type=positive_int,
        default=20,
        metavar="N",
        help="at most this many (default: %(default)s)",
    )
    trail.add_argument("--job", metavar="MESSAGE_ID", help="only the entries naming this job")
    unwind = add("unwind-fair", "move fair queues' jobs back into their queues' lists")
    unwind.add_argument(
        "queues", nargs="*", metavar="QUEUE", help="queue names, as 'jobs status' lists"
    )
    unwind.add_argument(
        "--all",
        action="store_true",
        dest="every",
        help="every queue with fair key lists in Redis, declared by an actor or not",
    )
    for verb, summary in ((PAUSE, "pause queues"), (RESUME, "resume paused queues")):
        add(verb, summary).add_argument(
            "queues", nargs="+", metavar="QUEUE", help="queue names, as 'jobs status' lists"
        )
