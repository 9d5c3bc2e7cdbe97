"""manage.py jobs: status, failed, retry, cancel, pause and resume from a terminal.

Real Redis, a real database and real in-process workers; the command runs
through call_command, and from a real process where exit statuses matter.
"""

from __future__ import annotations

import getpass
import io
import json
import logging
import os
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from jobs.broker import queues, workers
from jobs.consistency import reachability
from jobs.consistency.outbox import relay_once
from jobs.errors import PermanentJobError
from jobs.ledger import operations
from jobs.ledger import writer as ledger
from jobs.models import Job, OutboxMessage
from tests.conftest import IDLE_POLL_MS, join, queued_messages

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[3]
QUEUE = "cli-test"
switch = {"broken": True}


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def cli_flaky(note: str) -> None:
    if switch["broken"]:
        raise ValueError(f"flaky {note}")


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def cli_doomed(note: str) -> None:
    raise PermanentJobError(f"cannot handle {note}")


@dramatiq.actor(queue_name=QUEUE, max_retries=3)
def cli_counted(count: int) -> None:
    """Sent with a string, it fails with InvalidPayload before it runs: for good."""


@pytest.fixture(autouse=True)
def _broken() -> None:
    switch["broken"] = True


def run_queue(broker: dramatiq.Broker) -> None:
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        join(QUEUE)
    finally:
        worker.stop()
    ledger.flush()


def fail(broker: dramatiq.Broker, *messages: dramatiq.Message[Any]) -> list[Job]:
    """Run the queue (the messages fail) and return their ledger rows, in order."""
    run_queue(broker)
    rows = {job.message_id: job for job in Job.objects.all()}
    jobs = [rows[message.message_id] for message in messages]
    assert all(job.state == "failed" for job in jobs)
    return jobs


class Terminal(io.StringIO):
    """An operator at a terminal, with the answers already typed."""

    def isatty(self) -> bool:
        return True


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def jobs(*args: str, stdin: io.StringIO | None = None) -> Result:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command("jobs", *args, stdout=out, stderr=err, stdin=stdin or io.StringIO())
    except SystemExit as exc:  # the result was printed; the exit status says more
        code = int(exc.code or 0)
    except CommandError as exc:
        code = exc.returncode
        err.write(str(exc))
    return Result(code, out.getvalue(), err.getvalue())


def running_job(pid: int) -> Job:
    now = timezone.now()
    return Job.objects.create(
        message_id=str(uuid.uuid4()),
        actor_name="cli_flaky",
        queue_name=QUEUE,
        state="running",
        enqueued_at=now,
        started_at=now - timedelta(minutes=5),
        worker_host=socket.gethostname(),
        worker_pid=pid,
    )


# --- status ------------------------------------------------------------------


def shipped_ledger_batches(settings: Any) -> None:
    """First sends wait in the ledger's Redis intake, as they do with the shipped
    200 ms batches (the tests' 0 writes them at once): no worker runs to drain it,
    so only the command's own catch-up can count them."""
    settings.JOBS_LEDGER_FLUSH_MS = 200


def test_status_shows_queues_workers_ledger_counts_and_stale_jobs(settings: Any) -> None:
    # Given two waiting jobs on a paused queue, this process beating as a
    # worker with one running job, and a running job of a worker that is gone
    shipped_ledger_batches(settings)
    cli_flaky.send("one")
    cli_flaky.send("two")
    queues.pause(QUEUE)
    workers.beat()
    ours = running_job(os.getpid())
    orphan = running_job(4_000_000)  # above any pid_max: no such process

    # When the operator asks for the status
    result = jobs("status", "--json")

    # Then every figure is there, in one JSON document
    assert result.code == 0
    report = result.json()
    [queue] = [q for q in report["queues"] if q["name"] == QUEUE]
    assert (queue["waiting"], queue["delayed"], queue["dead"], queue["paused"]) == (2, 0, 0, True)
    assert queue["oldest_waiting_age_s"] >= 0
    assert QUEUE in report["paused"]
    me = f"{socket.gethostname()}:{os.getpid()}"
    assert {"worker": me, "running": 1} in report["workers"]
    assert report["ledger"]["all"]["enqueued"] == 2  # sent jobs caught up from the intake
    assert report["ledger"]["all"]["running"] == 2
    assert [j["message_id"] for j in report["stale_running"]] == [orphan.message_id]
    assert ours.message_id not in json.dumps(report["stale_running"])


def test_status_as_text_reads_as_tables() -> None:
    cli_flaky.send("one")
    queues.pause(QUEUE)

    result = jobs("status")

    assert result.code == 0
    [line] = [line for line in result.out.splitlines() if line.startswith(f"{QUEUE} ")]
    assert line.split() == [QUEUE, "1", "0", "0", line.split()[4], "s", "paused"]
    assert "Workers: 0 live" in result.out
    assert "Stale running jobs (worker gone): 0" in result.out


# --- failed ------------------------------------------------------------------


def test_failed_lists_newest_first_with_the_error_and_failures_for_good(
    broker: dramatiq.Broker,
) -> None:
    first = cli_flaky.send("first")
    fail(broker, first)
    invalid = cli_counted.send("not a number")  # type: ignore[arg-type]
    fail(broker, invalid)
    third = cli_flaky.send("third")
    fail(broker, third)

    listed = jobs("failed", "--limit", "2", "--json").json()

    assert listed["total"] == 3
    assert [j["message_id"] for j in listed["jobs"]] == [third.message_id, invalid.message_id]
    newest, permanent = listed["jobs"]
    assert (newest["error_type"], newest["error_message"]) == ("ValueError", "flaky third")
    assert (newest["permanent"], permanent["permanent"]) == (False, True)
    assert permanent["error_type"] == "InvalidPayload"
    assert (permanent["attempts"], permanent["max_attempts"]) == (1, 4)

    text = jobs("failed", "--actor", "cli_counted")
    assert text.code == 0
    [row] = [line for line in text.out.splitlines() if invalid.message_id in line]
    assert "1 of 4" in row
    assert "InvalidPayload: " in row
    assert row.endswith("failed for good")
    assert "1 of 1 failed job(s), newest first" in text.out


def test_failed_exits_1_when_nothing_matches(broker: dramatiq.Broker) -> None:
    fail(broker, cli_flaky.send("x"))

    result = jobs("failed", "--actor", "cli_doomed", "--json")

    assert result.code == 1
    assert result.json() == {"total": 0, "jobs": []}


# --- retry -------------------------------------------------------------------


def test_retry_by_filter_re_enqueues_exactly_the_matching_jobs(broker: dramatiq.Broker) -> None:
    # Given three failed jobs, two of them about "alpha"
    alpha1, alpha2, beta = (cli_flaky.send(n) for n in ("alpha-1", "alpha-2", "beta-1"))
    fail(broker, alpha1, alpha2, beta)
    alphas = {alpha1.message_id, alpha2.message_id}

    # When the operator retries what the search finds
    result = jobs("retry", "--search", "alpha", "--yes", "--json")

    # Then exactly those two are sent again, linked to their originals
    assert result.code == 0
    assert (result.json()["matched"], result.json()["done"]) == (2, 2)
    sent = queued_messages(QUEUE)
    assert {m.options["retry_of"] for m in sent} == alphas
    assert sorted(m.args[0] for m in sent) == ["alpha-1", "alpha-2"]
    retried_as = dict(Job.objects.values_list("message_id", "retried_as"))
    assert {retried_as[i] for i in alphas} == {m.message_id for m in sent}
    assert retried_as[beta.message_id] is None

    # and, the fault fixed, the retries succeed and the ledger links them
    switch["broken"] = False
    run_queue(broker)
    retries = Job.objects.filter(retry_of__message_id__in=alphas)
    assert sorted(retries.values_list("state", flat=True)) == ["succeeded", "succeeded"]
    assert not Job.objects.filter(retry_of__message_id=beta.message_id).exists()


def test_retry_leaves_failures_for_good_alone_unless_asked(broker: dramatiq.Broker) -> None:
    invalid = cli_counted.send("x")  # type: ignore[arg-type]
    doomed, flaky = cli_doomed.send("y"), cli_flaky.send("z")
    fail(broker, invalid, doomed, flaky)

    result = jobs("retry", "--queue", QUEUE, "--yes", "--json")

    assert result.code == 1  # some were left alone
    report = result.json()
    assert (report["matched"], report["done"], report["permanent_skipped"]) == (3, 1, 2)
    assert sorted(report["permanent_errors"]) == ["InvalidPayload", "PermanentJobError"]
    assert [m.options["retry_of"] for m in queued_messages(QUEUE)] == [flaky.message_id]

    again = jobs("retry", "--queue", QUEUE, "--include-permanent", "--yes", "--json").json()

    assert (again["done"], again["already_retried"], again["permanent_skipped"]) == (2, 1, 0)
    retried = {m.options["retry_of"] for m in queued_messages(QUEUE)}
    assert retried == {invalid.message_id, doomed.message_id, flaky.message_id}


def test_retry_takes_ledger_ids_and_message_ids_and_names_the_missing(
    broker: dramatiq.Broker,
) -> None:
    first, second, other = (cli_flaky.send(n) for n in ("a", "b", "c"))
    by_pk, by_message_id, _ = fail(broker, first, second, other)
    missing = str(uuid.uuid4())

    result = jobs(
        "retry", str(by_pk.pk), by_message_id.message_id, missing, "987654", "--yes", "--json"
    )

    assert result.code == 1  # two ids named no job
    report = result.json()
    assert report["selection"]["ids"] == [
        str(by_pk.pk),
        by_message_id.message_id,
        missing,
        "987654",
    ]
    assert (report["matched"], report["done"]) == (2, 2)
    assert report["not_found"] == [missing, "987654"]
    assert {m.options["retry_of"] for m in queued_messages(QUEUE)} == {
        first.message_id,
        second.message_id,
    }


def test_retry_asks_first_and_does_nothing_when_declined(broker: dramatiq.Broker) -> None:
    fail(broker, cli_flaky.send("x"))

    declined = jobs("retry", "--actor", "cli_flaky", stdin=Terminal("n\n"))

    assert declined.code == 1
    assert "Retry 1 failed job(s) matching actor='cli_flaky'? [y/N]" in declined.err
    assert "Nothing done: 1 failed job(s) match actor='cli_flaky'." in declined.out
    assert queued_messages(QUEUE) == []

    accepted = jobs("retry", "--actor", "cli_flaky", stdin=Terminal("y\n"))

    assert accepted.code == 0
    assert "Retried 1 of 1 failed job(s) matching actor='cli_flaky'." in accepted.out
    assert len(queued_messages(QUEUE)) == 1


def test_without_a_terminal_it_needs_yes(broker: dramatiq.Broker) -> None:
    fail(broker, cli_flaky.send("x"))

    result = jobs("retry", "--all", stdin=io.StringIO("y\n"))  # a pipe, not a terminal

    assert result.code == 2
    assert "stdin is not a terminal" in result.err
    assert "--yes" in result.err
    assert queued_messages(QUEUE) == []


def test_an_empty_filter_needs_all(broker: dramatiq.Broker) -> None:
    fail(broker, cli_flaky.send("x"))

    refused = jobs("retry", "--yes")

    assert refused.code == 2
    assert "--all" in refused.err
    assert queued_messages(QUEUE) == []
    assert jobs("retry", "--all", "--yes").code == 0
    assert len(queued_messages(QUEUE)) == 1


def test_a_dry_run_counts_and_sends_nothing(broker: dramatiq.Broker) -> None:
    retried, _, _ = fail(broker, cli_flaky.send("x"), cli_flaky.send("y"), cli_doomed.send("z"))
    assert jobs("retry", str(retried.pk), "--yes").code == 0

    result = jobs("retry", "--all", "--dry-run", "--json")

    assert result.code == 0
    report = result.json()
    assert (report["dry_run"], report["matched"], report["done"]) == (True, 3, 0)
    assert (report["already_retried"], report["permanent_skipped"]) == (1, 1)
    assert len(queued_messages(QUEUE)) == 1  # the first retry's, none more
    assert Job.objects.exclude(retried_as=None).count() == 1


def test_long_runs_report_progress_per_batch_on_stderr(broker: dramatiq.Broker) -> None:
    fail(broker, *(cli_flaky.send(str(n)) for n in range(3)))

    result = jobs("retry", "--all", "--yes", "--batch", "1", "--json")

    progress = [line for line in result.err.splitlines() if line.startswith("retry: ")]
    assert [line.split(" (")[0] for line in progress] == ["retry: 1/3", "retry: 2/3", "retry: 3/3"]
    assert progress[-1].endswith("retried 3, already retried 0, not retriable 0")
    assert result.json()["done"] == 3  # stdout holds the document alone
    assert len(queued_messages(QUEUE)) == 3


def test_a_redis_failure_mid_run_leaves_the_rest_to_the_outbox_once_each(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two failed jobs, and Redis refusing every send after the first
    first, second = cli_flaky.send("1"), cli_flaky.send("2")
    fail(broker, first, second)
    enqueue = broker.enqueue
    sent: list[dramatiq.Message[Any]] = []

    def refusing(message: dramatiq.Message[Any], **kwargs: Any) -> Any:
        if sent:
            raise redis.ConnectionError("Connection refused")
        sent.append(message)
        return enqueue(message, **kwargs)

    monkeypatch.setattr(broker, "enqueue", refusing)

    # When both are retried, one per batch
    result = jobs("retry", "--all", "--yes", "--batch", "1", "--json")

    # Then both are retried: the second waits in the outbox (before, the command
    # stopped there with exit 3 and left the second for a rerun)
    assert result.code == 0, result.err
    assert result.json()["done"] == 2
    assert len(queued_messages(QUEUE)) == 1
    assert OutboxMessage.objects.filter(sent_at__isnull=True).count() == 1

    # and, Redis back, the relay sends it; a rerun sends nothing more
    monkeypatch.undo()
    reachability.reset()
    OutboxMessage.objects.update(claimed_until=None, created_at=timezone.now() - timedelta(hours=1))
    assert relay_once() == 1
    rerun = jobs("retry", "--all", "--yes", "--json").json()
    assert (rerun["done"], rerun["already_retried"]) == (0, 2)
    retried = [m.options["retry_of"] for m in queued_messages(QUEUE)]
    assert sorted(retried) == sorted([first.message_id, second.message_id])


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def cli_next_step(note: str) -> None:
    pass


def test_a_retry_while_redis_is_away_waits_for_the_whole_message(broker: dramatiq.Broker) -> None:
    # Given a failed first step of a pipeline: its next step is in the message
    # Redis keeps dead-lettered, not in the ledger's row
    first = cli_flaky.message_with_options(args=("piped",), time_limit=12_345)
    dramatiq.pipeline([first, cli_next_step.message("then")]).run()  # type: ignore[no-untyped-call]
    (job,) = fail(broker, first)
    assert "pipe_target" not in job.options

    # When an operator retries it while Redis has just failed to answer this
    # process (the dead letter cannot be read)
    reachability.note_unreachable()
    try:
        away = jobs("retry", "--all", "--yes", "--json")
    finally:
        reachability.reset()

    # Then nothing is sent, and the command says why (before: a retry built
    # from the ledger, without the next step, so the pipeline stopped there)
    assert away.json()["done"] == 0
    assert away.json()["redis_not_answering"] == 1
    assert away.code == 3  # Redis or the database unreachable, as documented
    job.refresh_from_db()
    assert job.retried_as is None

    # and once Redis answers, the retry carries the whole message
    outcome = operations.retry_jobs(Job.objects.filter(pk=job.pk))
    assert outcome.done == 1
    job.refresh_from_db()
    [retry] = [m for m in queued_messages(QUEUE) if m.message_id == job.retried_as]
    assert retry.options["pipe_target"]["actor_name"] == "cli_next_step"
    assert retry.options["time_limit"] == 12_345


# --- cancel ------------------------------------------------------------------


def test_cancel_by_filter_makes_workers_skip_exactly_those(
    broker: dramatiq.Broker, settings: Any
) -> None:
    # Given three waiting jobs, sent while no worker runs
    shipped_ledger_batches(settings)
    switch["broken"] = False
    doomed = [cli_flaky.send("cancel-me 1"), cli_flaky.send("cancel-me 2")]
    kept = cli_flaky.send("keep")

    # When two of them are cancelled by search
    result = jobs("cancel", "--search", "cancel-me", "--yes", "--json")

    # Then workers skip those two and run the other
    assert (result.code, result.json()["matched"], result.json()["done"]) == (0, 2, 2)
    run_queue(broker)
    for message in doomed:
        job = Job.objects.get(message_id=message.message_id)
        assert (job.state, job.skip_reason, job.attempts) == ("cancelled", "cancelled", 0)
    assert Job.objects.get(message_id=kept.message_id).state == "succeeded"


def test_cancel_by_state_leaves_the_other_waiting_jobs(broker: dramatiq.Broker) -> None:
    later = cli_flaky.send_with_options(args=("later",), delay=60_000)
    now = cli_flaky.send("now")
    ledger.flush()

    result = jobs("cancel", "--queue", QUEUE, "--state", "delayed", "--yes", "--json")

    assert (result.code, result.json()["done"]) == (0, 1)
    states = dict(Job.objects.values_list("message_id", "state"))
    assert (states[later.message_id], states[now.message_id]) == ("cancelled", "enqueued")
    assert later.message_id in queues.controls().cancelled
    assert now.message_id not in queues.controls().cancelled


class HesitatingOperator(Terminal):
    """Answers yes, but only after a worker ran the queue while the question was up."""

    def __init__(self, broker: dramatiq.Broker) -> None:
        super().__init__("y\n")
        self.broker = broker

    def readline(self, size: int = -1, /) -> str:  # type: ignore[override]  # as typeshed
        run_queue(self.broker)
        return super().readline(size)


def test_cancel_counts_the_jobs_that_started_before_it_reached_them(
    broker: dramatiq.Broker,
) -> None:
    switch["broken"] = False
    message = cli_flaky.send("x")

    result = jobs("cancel", "--queue", QUEUE, "--json", stdin=HesitatingOperator(broker))

    assert result.code == 1
    report = result.json()
    assert (report["matched"], report["done"], report["started_meanwhile"]) == (1, 0, 1)
    assert Job.objects.get(message_id=message.message_id).state == "succeeded"
    assert message.message_id not in queues.controls().cancelled


def test_cancel_asks_a_running_job_to_stop_and_a_second_cancel_says_it_was_asked() -> None:
    job = running_job(os.getpid())

    first = jobs("cancel", str(job.pk), "--yes", "--json")
    again = jobs("cancel", str(job.pk), "--yes", "--json")

    assert first.code == 0  # everything asked for was done: the worker stops it
    assert (first.json()["done"], first.json()["requested_running"]) == (0, 1)
    assert job.message_id in queues.controls().cancelled
    assert again.code == 0
    assert (again.json()["already_requested"], again.json()["started_meanwhile"]) == (1, 0)
    job.refresh_from_db()
    assert (job.cancelled_by or "").endswith("(manage.py jobs)")


# --- pause and resume --------------------------------------------------------


def test_pause_and_resume_queues() -> None:
    assert jobs("pause", QUEUE).code == 0
    assert QUEUE in queues.controls().paused
    assert "Already paused: cli-test." in jobs("pause", QUEUE).out

    resumed = jobs("resume", QUEUE, "--json")

    assert resumed.json() == {
        "action": "resume",
        "queues": [QUEUE],
        "changed": [QUEUE],
        "unchanged": [],
    }
    assert QUEUE not in queues.controls().paused


def test_an_unknown_queue_is_a_usage_error_naming_the_known_ones() -> None:
    result = jobs("pause", "no-such-queue", "--json")

    assert result.code == 2
    error = result.json()["error"]
    assert "unknown queue(s): no-such-queue" in error
    assert QUEUE in error
    assert not queues.controls().paused


def test_a_paused_queue_no_actor_declares_can_still_be_resumed() -> None:
    queues.pause("gone-queue")

    assert jobs("resume", "gone-queue").code == 0
    assert not queues.controls().paused


# --- audit, JSON errors, exit statuses ---------------------------------------


def test_every_subcommand_writes_an_audit_line(
    broker: dramatiq.Broker, caplog: pytest.LogCaptureFixture
) -> None:
    fail(broker, cli_flaky.send("x"))
    caplog.set_level(logging.INFO, logger="jobs.audit")

    jobs("status")
    jobs("failed")
    jobs("retry", "--actor", "cli_flaky", "--yes")
    jobs("cancel", "--all", "--dry-run")
    jobs("pause", QUEUE)
    jobs("resume", QUEUE)

    records = [r for r in caplog.records if r.name == "jobs.audit"]
    assert [(r.audit_action, r.audit_outcome) for r in records] == [  # type: ignore[attr-defined]
        ("status", "done"),
        ("failed", "done"),
        ("retry", "done"),
        ("cancel", "dry run"),
        ("pause", "done"),
        ("resume", "done"),
    ]
    assert {r.audit_user for r in records} == {getpass.getuser()}  # type: ignore[attr-defined]
    retry = records[2]
    assert retry.audit_target == {"actor": "cli_flaky", "include_permanent": False}  # type: ignore[attr-defined]
    assert retry.audit_count == 1  # type: ignore[attr-defined]
    assert getpass.getuser() in retry.getMessage()
    assert records[4].audit_target == {"queues": [QUEUE]}  # type: ignore[attr-defined]


def test_errors_in_json_mode_are_one_json_document() -> None:
    bad_time = jobs("failed", "--since", "yesterday", "--json")

    assert bad_time.code == 2
    assert "ISO date or datetime" in bad_time.json()["error"]

    both = jobs("cancel", "42", "--queue", QUEUE, "--json")
    assert both.code == 2
    assert both.json() == {"error": "give ids or filters, not both"}


def manage(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url,
        "REDIS_URL": settings.REDIS_URL,
    }
    return subprocess.run(
        [sys.executable, "manage.py", "jobs", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_json_from_a_real_process(test_database_url: str) -> None:
    from tests.examples.tasks import demo_pipeline

    # Given a waiting job on a queue that process declares, a paused queue it
    # does not declare, and a failed job in the ledger
    demo_pipeline.send("cli")
    queues.pause(QUEUE)
    Job.objects.create(
        message_id=str(uuid.uuid4()),
        actor_name="cli_flaky",
        queue_name=QUEUE,
        state="failed",
        enqueued_at=timezone.now(),
    )

    done = manage("status", "--json", database_url=test_database_url)

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # the whole of stdout is one document
    [default] = [q for q in report["queues"] if q["name"] == "default"]
    assert default["waiting"] == 1
    assert QUEUE in report["paused"]
    assert report["ledger"]["all"]["failed"] == 1
    assert report["ledger"]["all"]["enqueued"] == 1


def test_exit_statuses_from_a_real_process(test_database_url: str) -> None:
    empty_filter = manage("retry", "--json", database_url=test_database_url)
    assert empty_filter.returncode == 2
    assert "--all" in json.loads(empty_filter.stdout)["error"]
    assert "--all" in empty_filter.stderr

    bad_argument = manage("failed", "--limit", "0", "--json", database_url=test_database_url)
    assert bad_argument.returncode == 2
    assert "must be 1 or more" in json.loads(bad_argument.stdout)["error"]
    assert "usage: manage.py jobs failed" in bad_argument.stderr

    nothing = manage("cancel", "--all", "--yes", database_url=test_database_url)
    assert nothing.returncode == 1
    assert "Nothing to cancel: no waiting or running job(s) match (no filter)." in nothing.stdout
