"""The Dramatiq middleware that turns message hooks into ledger events.

Listed just before Retries in ``DRAMATIQ_BROKER["MIDDLEWARE"]``: Dramatiq runs
after_* hooks in reverse order, so when our ``after_process_message`` runs,
Retries has already either failed the message (``message.failed``) or
re-enqueued it for a retry or, after a deferral, as the same attempt.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from datetime import UTC, datetime
from typing import Any

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name

from jobs.conf import jobs_settings
from jobs.errors import DEFERRALS, is_cancel, is_deferral
from jobs.ledger import states
from jobs.ledger import writer as ledger
from jobs.ledger.intake import Drainer, is_first_send
from jobs.ledger.redaction import (
    mask_values,
    redact,
    redact_arguments,
    redact_text,
    secret_values,
)
from jobs.ledger.references import OPTION as REFERS_TO
from jobs.ledger.references import SEARCH_OPTION as SEARCH_BY
from jobs.ledger.references import subjects_of
from jobs.ledger.writer import (
    PHASE_DELAYED,
    PHASE_ENQUEUED,
    PHASE_RUNNING,
    TERMINAL,
    Event,
    progress_of,
)

HOST = socket.gethostname()
# Seconds a stopping worker waits for its last ledger batch and held acks.
SHUTDOWN_FLUSH_WAIT = 60.0
logger = logging.getLogger(__name__)
MAX_TEXT = 10_000
# dedup_key: cancelling a send_unique() job from the admin frees its key.
_OPTION_KEYS = (
    "max_retries",
    "min_backoff",
    "max_backoff",
    "time_limit",
    "max_age",
    "retry_of",
    "dedup_key",
)


def _now() -> datetime:
    return datetime.now(UTC)


def _from_millis(millis: int | float) -> datetime:
    return datetime.fromtimestamp(millis / 1000, UTC)


def _attempt_index(message: dramatiq.Message[Any] | MessageProxy) -> int:
    """0-based index of the message's next attempt, from Dramatiq's retry count.

    A redelivery after a crash has the same index; the ledger writer tells it
    apart by its start time and counts it as one more attempt.
    """
    return int(message.options.get("retries", 0))


def _attempt_number(message: MessageProxy) -> int:
    return _attempt_index(message) + 1


def _deferrals(message: dramatiq.Message[Any] | MessageProxy) -> int:
    """How often the current attempt was deferred (set by the Retries middleware)."""
    return int(message.options.get(DEFERRALS, 0))


def _default_max_retries(broker: Broker) -> int:
    for middleware in broker.middleware:
        if hasattr(middleware, "max_retries"):
            return int(middleware.max_retries)
    return 0


def _max_attempts(broker: Broker, actor_name: str, options: dict[str, Any]) -> int:
    max_retries = options.get("max_retries")
    actor = broker.actors.get(actor_name)
    if max_retries is None and actor is not None:
        max_retries = actor.options.get("max_retries")
    if max_retries is None:
        max_retries = _default_max_retries(broker)
    return int(max_retries) + 1


def _create_fields(broker: Broker, message: dramatiq.Message[Any] | MessageProxy) -> dict[str, Any]:
    # Each attribute read once: a MessageProxy forwards every read through
    # __getattr__ (30 of them per job here before).
    actor_name, options = message.actor_name, message.options
    args, kwargs = redact_arguments(actor_name, message.args, message.kwargs)
    return {
        "actor_name": actor_name,
        "queue_name": q_name(message.queue_name),
        "args": args,
        "kwargs": kwargs,
        "options": redact({k: options[k] for k in _OPTION_KEYS if k in options}),
        "enqueued_at": _from_millis(message.message_timestamp),
        "max_attempts": _max_attempts(broker, actor_name, options),
        "retry_of_id": options.get("retry_of"),
    }


def _subjects(broker: Broker, message: dramatiq.Message[Any] | MessageProxy) -> tuple[str, ...]:
    actor = broker.actors.get(message.actor_name)
    return subjects_of(actor, message.args, message.kwargs) if actor is not None else ()


def _error_fields(message: MessageProxy, exception: BaseException) -> dict[str, Any]:
    # Messages and tracebacks are shown in the admin and to task result readers:
    # a secret that slipped into an exception message must not be, named or not.
    secrets = secret_values(message.actor_name, message.args, message.kwargs)

    def clean(text: str) -> str:
        return redact_text(mask_values(text, secrets))

    text = clean("".join(traceback.format_exception(exception)))
    kind = type(exception)
    return {
        "error_type": kind.__name__,
        "error_class_path": f"{kind.__module__}.{kind.__qualname__}"[:300],
        "error_message": clean(_text_of(exception))[:MAX_TEXT],
        "traceback": text[-MAX_TEXT:],
    }


def error_text(message: dramatiq.Message[Any] | MessageProxy, exception: BaseException) -> str:
    """The error's text as the ledger records it: printable whatever its
    ``__str__`` does, and with the job's secrets masked (also for a failure
    callback, jobs.middleware.callbacks)."""
    secrets = secret_values(message.actor_name, message.args, message.kwargs)
    return redact_text(mask_values(_text_of(exception), secrets))[:MAX_TEXT]


def _text_of(exception: BaseException) -> str:
    """``str(exception)``, or a stand-in when its ``__str__`` raises: this hook
    failing would let the ack go out with the row left "running"."""
    try:
        return str(exception)
    except Exception:
        return "<exception str() failed>"  # as traceback.format_exception says it


def _stores_return_value(broker: Broker, message: MessageProxy) -> bool:
    actor = broker.actors.get(message.actor_name)
    return bool(actor is not None and actor.options.get("store_return_value"))


def _acks_after_ledger(broker: Broker) -> bool:
    """Whether the broker's consumers hold each ack until the ledger wrote the
    job's events (``jobs.broker.acks``), so no worker thread needs to wait."""
    return bool(getattr(broker, "acks_after_ledger", False))


def _record_before_ack(broker: Broker, message: MessageProxy, event: Event) -> None:
    """Record a job's end so that it is durable before the message is acked."""
    if _acks_after_ledger(broker):
        ledger.hold(message, ledger.record(event, before_ack=True))
    else:
        ledger.record(event, durable=True)


def enqueue_event(broker: Broker, message: dramatiq.Message[Any], *, delayed: bool) -> Event:
    """The "enqueued" (or, on the delay queue, "delayed") event of ``message``."""
    attempt = _attempt_index(message)
    update: dict[str, Any] = {"redis_message_id": message.options.get("redis_message_id", "")}
    if delayed:
        state, phase = states.DELAYED, PHASE_DELAYED
        update["next_retry_at"] = _from_millis(message.options.get("eta", time.time() * 1000))
    else:
        state, phase = states.ENQUEUED, PHASE_ENQUEUED
    return Event(
        message.message_id,
        state,
        progress_of(attempt, phase, _deferrals(message)),
        _create_fields(broker, message),
        update,
        subjects=_subjects(broker, message),
    )


class Ledger(dramatiq.Middleware):
    """Records every message's state, attempts, timings and failures.

    An actor with ``store_return_value=True`` (the Django tasks backend's) also
    has its return value kept; it must already be JSON-safe and size-capped.
    """

    # ``refers_to={"user_id": "auth.User"}``, ``search_by=("order.number",)``:
    # see jobs.ledger.references. One set: dramatiq's @actor refuses an option
    # no middleware declares.
    actor_options = {"store_return_value", REFERS_TO, SEARCH_BY}

    def __init__(self) -> None:
        # message id -> (monotonic start, wall-clock start, attempt number,
        # progress, row fields, subjects): what after_process_message needs,
        # computed once per delivery.
        self._started: dict[
            str, tuple[float, datetime, int, int, dict[str, Any], tuple[str, ...]]
        ] = {}
        # One intake drainer per process, however many workers it runs.
        self._drainer: Drainer | None = None
        # The workers booted here, by identity: counted, a worker stopped twice
        # stopped the drainer under another still running.
        self._workers: set[int] = set()
        self._mutex = threading.Lock()

    def in_ledger_intake(self, broker: Broker, message: dramatiq.Message[Any]) -> bool:
        """Asked by a broker with ``ledger_intake``: whether its enqueue script
        records this message in the Redis intake (``jobs.ledger.intake``).
        Not with ``JOBS_LEDGER_FLUSH_MS`` = 0, which writes every event at once."""
        return (
            jobs_settings.JOBS_LEDGER_FLUSH_MS > 0
            and bool(jobs_settings.JOBS_LEDGER_ENABLED)
            and is_first_send(message)
        )

    def after_enqueue(
        self, broker: Broker, message: dramatiq.Message[Any], delay: int | None
    ) -> None:
        if getattr(broker, "ledger_intake", False) and self.in_ledger_intake(broker, message):
            return  # the enqueue script put it in the intake
        if message.actor_name not in broker.actors:
            # Put back by a worker that does not know it (jobs.broker.unknown_actors):
            # recorded by one that does, which can redact its arguments by name.
            return
        ledger.record(enqueue_event(broker, message, delayed=bool(delay)))

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        message_id = message.message_id
        number = _attempt_number(message)
        started = _now()
        create = _create_fields(broker, message)
        deferrals = _deferrals(message)
        progress = progress_of(number - 1, PHASE_RUNNING, deferrals)
        subjects = _subjects(broker, message)
        self._started[message_id] = (time.monotonic(), started, number, progress, create, subjects)
        update = {
            "attempts": number,
            "started_at": started,
            "worker_host": HOST,
            "worker_pid": os.getpid(),
            "next_retry_at": None,
            "redis_message_id": message.options.get("redis_message_id", ""),
        }
        # After a deferral this delivery goes on with the same attempt.
        ledger.record(
            Event(
                message_id,
                states.RUNNING,
                progress,
                create,
                update,
                resumes=deferrals > 0,
                subjects=subjects,
            )
        )

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        started = self._started.pop(message.message_id, None)
        if started is None:  # a middleware before ours stopped the message early
            number = _attempt_number(message)
            running = progress_of(number - 1, PHASE_RUNNING, _deferrals(message))
            started = (time.monotonic(), _now(), number, running, {}, _subjects(broker, message))
        started_mono, started_at, number, running, create, subjects = started
        if is_deferral(exception) and not message.failed:
            # Not an attempt: Retries put the message back and our after_enqueue
            # recorded it "delayed". Written before the ack like a failure, or
            # a worker dying now would leave the job "running" on an acked
            # message, which the watchdog takes for a success.
            if _acks_after_ledger(broker):
                ledger.hold(message, ledger.hold_ack())
            else:
                ledger.flush(ledger.BatchWriter.DURABLE_WAIT)
            return
        create = create or _create_fields(broker, message)
        timing = {
            "finished_at": _now(),
            "duration_ms": int((time.monotonic() - started_mono) * 1000),
        }
        if exception is None:
            if _stores_return_value(broker, message):
                timing["return_value"] = result
            # Written before the ack, like a failure: once the message is acked
            # nothing in Redis says the job ran, so a success lost with a killed
            # worker's batch could only be guessed.
            _record_before_ack(
                broker,
                message,
                Event(
                    message.message_id,
                    states.SUCCEEDED,
                    TERMINAL,
                    create,
                    timing,
                    subjects=subjects,
                ),
            )
            return
        errors = _error_fields(message, exception)
        if is_cancel(exception):
            # Stopped by an operator: its own state, and no failed attempt.
            _record_before_ack(
                broker,
                message,
                Event(
                    message.message_id,
                    states.CANCELLED,
                    TERMINAL,
                    create,
                    {**timing, **errors},
                    subjects=subjects,
                ),
            )
            return
        failure = {
            "number": number,
            "started_at": started_at,
            "worker_host": HOST,
            "worker_pid": os.getpid(),
            **timing,
            **errors,
        }
        if message.failed:
            state, progress = states.FAILED, TERMINAL
            update = {**timing, **errors}
        else:
            # Retries has enqueued the retry already (a "delayed" event for the
            # next attempt); this one only notes the error on the job.
            state, progress, update = states.RUNNING, running, {}
        _record_before_ack(
            broker,
            message,
            Event(
                message.message_id,
                state,
                progress,
                create,
                update,
                failure,
                annotate=errors,
                subjects=subjects,
            ),
        )

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._started.pop(message.message_id, None)
        if message.options.get("paused_requeue"):
            # Its put-back (jobs.middleware.control) was recorded "delayed" by
            # after_enqueue just now: written before this delivery's ack, as a
            # deferral's is, so a kill between cannot leave the row without it.
            if _acks_after_ledger(broker):
                ledger.hold(message, ledger.hold_ack())
            return
        reason = message.options.get("skip_reason", "age limit")
        _record_before_ack(
            broker,
            message,
            Event(
                message.message_id,
                states.CANCELLED if reason == "cancelled" else states.SKIPPED,
                TERMINAL,
                _create_fields(broker, message),
                {"finished_at": _now(), "skip_reason": reason},
                subjects=_subjects(broker, message),
            ),
        )

    def after_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        if not getattr(broker, "ledger_intake", False):
            return
        with self._mutex:
            self._workers.add(id(worker))
            if self._drainer is None:
                self._drainer = Drainer(broker)
                self._drainer.start()

    def after_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        drainer = None
        with self._mutex:
            if id(worker) in self._workers:
                self._workers.discard(id(worker))
                if not self._workers:
                    drainer, self._drainer = self._drainer, None
        if drainer is not None:
            drainer.stop()
        # The held acks go with the last batch: a stop that gave up sooner would
        # have every job that ended run again elsewhere. Past this, the stop goes
        # on and they are redelivered (at-least-once, as after a crash).
        # Not the intake: its entries wait in Redis for the next drain.
        if not ledger.flush(SHUTDOWN_FLUSH_WAIT, intake=False):
            logger.warning(
                "Job ledger not written within %.0f s of the stop; the jobs that ended "
                "last will be redelivered",
                SHUTDOWN_FLUSH_WAIT,
            )
