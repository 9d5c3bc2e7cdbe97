"""Example actors the tests drive; rundramatiq finds them as this app's ``tasks``."""

from __future__ import annotations

import ctypes
import logging
import os
import time

import dramatiq
from django.utils import timezone
from dramatiq.middleware import CurrentMessage

from jobs.broker import redis_broker
from jobs.consistency import checkpoints
from jobs.consistency.idempotency import once_atomic
from jobs.errors import TransientJobError

logger = logging.getLogger(__name__)


# An example of a multi-step job: each step is checkpointed, so a retry resumes
# after the last finished step; the final effect commits with its idempotency key
# (once_atomic), so a redelivered message cannot apply it twice. See
# docs/explanation/reliability.md; the crash and outage tests drive it.
@dramatiq.actor(queue_name="default", max_retries=3, min_backoff=200)
def demo_pipeline(key: str, steps: int = 5, step_ms: int = 0, fail_at_step: int = 0) -> None:
    message = CurrentMessage.get_current_message()
    first_attempt = message is None or not message.options.get("retries")
    for step in range(1, steps + 1):
        if checkpoints.done(step):
            continue
        if step == fail_at_step and first_attempt:
            raise TransientJobError(f"step {step} of {steps} failed (demo)")
        time.sleep(step_ms / 1000)
        checkpoints.save(step, {"finished_at": timezone.now().isoformat()})
    with once_atomic(f"demo-pipeline:{key}") as first:
        if first:
            logger.info("demo_pipeline %s finished its %d steps", key, steps)


def hold_the_gil(seconds: float) -> None:
    """Block the whole process for ``seconds``, as a C extension that keeps the GIL
    does (dramatiq issue 692: a solver call): no other thread runs meanwhile.
    ``PyDLL`` calls libc's ``sleep`` without releasing the GIL."""
    ctypes.PyDLL(None).sleep(int(seconds))


# Counts its starts in Redis, then works for ``seconds`` (asleep, or holding the
# GIL): the crash tests tell a job that ran once from one handed to a second
# worker while it still ran (or redelivered after its worker was killed).
@dramatiq.actor(queue_name="long", max_retries=0, time_limit=10 * 60_000)
def long_job(key: str, seconds: float, gil: bool = False) -> None:
    client = redis_broker().client
    client.incr(f"long-job:{key}:starts")
    if gil:
        hold_the_gil(seconds)
    else:
        time.sleep(seconds)
    client.incr(f"long-job:{key}:ends")


# Waits until the file ``gate`` exists, then counts a run in Redis: a test opens
# the gate while Redis is unreachable, so the job fails with a connection error
# at a moment of its choosing, and counts the run that finally gets through.
@dramatiq.actor(queue_name="long", max_retries=3, min_backoff=100, max_backoff=200)
def gated_redis_job(key: str, gate: str) -> None:
    while not os.path.exists(gate):
        time.sleep(0.05)
    redis_broker().client.incr(f"gated-job:{key}:runs")


# Waits for the file ``gate``, then fails its first try (a transient error,
# Redis reachable) and counts a later run in Redis: the failure's retry is
# enqueued at a moment the test chooses.
@dramatiq.actor(queue_name="long", max_retries=3, min_backoff=100, max_backoff=200)
def gated_flaky_job(key: str, gate: str) -> None:
    while not os.path.exists(gate):
        time.sleep(0.05)
    message = CurrentMessage.get_current_message()
    if message is not None and not message.options.get("retries"):
        raise TransientJobError("the first try fails")
    redis_broker().client.incr(f"gated-job:{key}:runs")
