"""``manage.py jobs``: status, failed, retry, cancel, pause, resume, from a terminal.

Parsing and dispatch only; each subcommand's work is in ``jobs.cli``.
"""

from __future__ import annotations

import sys
from typing import Any

import django.db
import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.cli import EXIT_OK, EXIT_PARTIAL, EXIT_UNAVAILABLE, EXIT_USAGE
from jobs.cli.actions import CANCEL, NOUN, RETRY, perform, plan
from jobs.cli.arguments import add_subcommands
from jobs.cli.console import Console, audit, operator, to_json
from jobs.cli.control import change_queues, change_text, unwind_queues, unwind_text
from jobs.cli.failed import failed_report, failed_text
from jobs.cli.schedules import change_schedule, schedules_report, schedules_text
from jobs.cli.schedules import change_text as change_schedule_text
from jobs.cli.selection import Selection, SelectionError, parse_ids, parse_when
from jobs.cli.status import status_report, status_text
from jobs.cli.trail import audit_report, audit_text
from jobs.ledger import intake
from jobs.ledger.audit import first_ids

# First sends reach the ledger through its Redis intake (jobs.ledger.intake):
# drained first, as the admin's pages do, so a job sent a moment ago while no
# worker runs is counted, listed and cancellable.
INTAKE_WAIT_S = 5.0
DOING = {RETRY: "Retrying", CANCEL: "Cancelling"}


class Command(BaseCommand):
    help = (
        "Operate the job platform from a terminal: queues, workers and ledger counts, failed "
        "jobs, retry and cancel by id or by the admin list's filters, pause and resume queues, "
        "periodic schedules, the audit trail, fair queues' jobs moved back before a rollback. "
        "Each subcommand takes --json and writes an audit line (logger jobs.audit, with the "
        "OS user). Exit status: 0 done; 1 nothing matched, declined or partly done; 2 usage "
        "error; 3 Redis or the database unreachable. See 'manage.py jobs SUBCOMMAND --help'."
    )
    # call_command(..., stdin=...): the terminal a test answers the question from.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        add_subcommands(parser)

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            return super().execute(*args, **options)
        except CommandError as exc:
            if options.get("json"):
                self.stdout.write(to_json({"error": str(exc)}))
            raise

    def handle(self, *args: Any, **options: Any) -> None:
        console = Console(
            self.stdout,
            self.stderr,
            json_mode=options["json"],
            verbosity=options["verbosity"],
            stdin=options.get("stdin") or sys.stdin,
        )
        subcommand = options["subcommand"]
        try:
            if subcommand == "status":
                code = self.status(console)
            elif subcommand == "failed":
                code = self.failed(console, options)
            elif subcommand in (RETRY, CANCEL):
                code = self.act(subcommand, console, options)
            elif subcommand == "schedules":
                code = self.schedules(console, options)
            elif subcommand == "unwind-fair":
                result = unwind_queues(options["queues"], every=options["every"])
                console.result(result, unwind_text(result))
                moved = sum(result["moved"].values())
                audit(subcommand, target={"queues": result["queues"]}, count=moved, message_ids=[])
                code = EXIT_OK
            elif subcommand == "audit":
                report = audit_report(options["limit"], options["job"])
                console.result(report, audit_text(report))
                code = EXIT_OK
            else:
                code = self.change(subcommand, console, options)
        except SelectionError as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        except redis.RedisError as exc:
            raise CommandError(f"Redis unreachable: {exc}", returncode=EXIT_UNAVAILABLE) from exc
        except django.db.Error as exc:
            raise CommandError(f"database error: {exc}", returncode=EXIT_UNAVAILABLE) from exc
        if code != EXIT_OK:
            # Not an error: the result is printed; only the exit status says more.
            raise SystemExit(code)

    def _catch_up(self, console: Console) -> None:
        if not intake.catch_up(timeout=INTAKE_WAIT_S):
            console.note(
                f"Warning: jobs sent in the last moments may be missing: the ledger's intake "
                f"was not written within {INTAKE_WAIT_S:g} s."
            )

    def status(self, console: Console) -> int:
        self._catch_up(console)
        report = status_report()
        console.result(report, status_text(report))
        audit("status", target={}, count=len(report["queues"]))
        return EXIT_OK

    def _selection(self, options: dict[str, Any]) -> Selection:
        return Selection(
            ids=parse_ids(options.get("ids") or []),
            actor=options["actor"],
            queue=options["queue"],
            state=options.get("state"),
            since=parse_when(options["since"], "--since") if options["since"] else None,
            until=parse_when(options["until"], "--until") if options["until"] else None,
            search=options["search"],
        )

    def failed(self, console: Console, options: dict[str, Any]) -> int:
        selection = self._selection(options)
        self._catch_up(console)
        report = failed_report(selection, options["limit"])
        console.result(report, failed_text(report))
        audit("failed", target=selection.describe(), count=len(report["jobs"]))
        return EXIT_OK if report["jobs"] else EXIT_PARTIAL

    def act(self, action: str, console: Console, options: dict[str, Any]) -> int:
        selection = self._selection(options)
        if selection.is_empty and not options["all"]:
            raise CommandError(
                f"no ids and no filter: that means every {NOUN[action]}. Give ids or filters, "
                "or --all to mean every one.",
                returncode=EXIT_USAGE,
            )
        asking = not (options["yes"] or options["dry_run"])
        if asking:
            console.can_ask()  # before any work: a script without --yes is wrong anyway
        self._catch_up(console)
        run, queryset = plan(
            action,
            selection,
            include_permanent=options.get("include_permanent", False),
            dry_run=options["dry_run"],
        )
        to_do = run.matched - run.permanent
        named: list[str] | None = None  # what the audit trail keeps, when something was done
        if to_do and not run.dry_run:
            jobs = f"{to_do:,} {NOUN[action]} matching {selection}"
            if run.permanent:
                jobs += f" ({run.permanent:,} that failed for good left alone)"
            if asking and not console.confirm(f"{action.capitalize()} {jobs}?"):
                run.declined = True
            else:
                console.note(f"{DOING[action]} {jobs}, in batches of {options['batch']:,}.")
                named = first_ids(queryset)
                perform(run, queryset, console, batch=options["batch"])
        console.result(run.document(), run.text())
        target = selection.describe()
        if action == RETRY:
            target["include_permanent"] = options["include_permanent"]
        counted = run.matched if run.dry_run or run.declined else run.done + run.requested
        done = run.done + run.requested
        audit(
            action,
            target=target,
            count=counted,
            outcome=run.outcome,
            message_ids=named if done else None,  # the admin's trail: what was done
        )
        if run.error or run.redis_away:  # Redis could not be reached, for some at least
            return EXIT_UNAVAILABLE
        return EXIT_OK if run.complete else EXIT_PARTIAL

    def schedules(self, console: Console, options: dict[str, Any]) -> int:
        verbs = [v for v in ("enable", "disable", "reset") if options[v]]
        verb = "edit" if options["cron"] is not None else (verbs[0] if verbs else None)
        if verb is None:
            if options["actor"]:
                raise SelectionError("give --cron, --enable, --disable or --reset with ACTOR")
            report = schedules_report()
            console.result(report, schedules_text(report))
            return EXIT_OK
        if not options["actor"]:
            raise SelectionError(f"--{'cron' if verb == 'edit' else verb} needs an ACTOR")
        result = change_schedule(options["actor"], verb, options["cron"], f"os:{operator()}")
        console.result(result, change_schedule_text(result))
        return EXIT_OK

    def change(self, verb: str, console: Console, options: dict[str, Any]) -> int:
        result = change_queues(verb, options["queues"])
        console.result(result, change_text(result))
        changed = len(result["changed"])
        # an entry in the admin's trail only when a queue changed
        audit(
            verb,
            target={"queues": result["queues"]},
            count=changed,
            message_ids=[] if changed else None,
        )
        return EXIT_OK
