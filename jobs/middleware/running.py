"""The jobs this process runs now (``jobs.runtime``): a cancel can reach them, and
their last progress report is written when they end.

Last in ``DRAMATIQ_BROKER["MIDDLEWARE"]``: its before hook runs just before the
actor and its after hook first after it. Every actor's function is wrapped
(``cancellation.guarded``) so that the job ends in its own frame: a forced stop
set as the job ends lands inside its call, or is withdrawn, never in a hook.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import dramatiq
from django import db
from dramatiq.broker import Broker, MessageProxy

from jobs.errors import JobCancelled, JobForceCancelled
from jobs.runtime import progress
from jobs.runtime.cancellation import guarded, registry

logger = logging.getLogger(__name__)


class RunningJobs(dramatiq.Middleware):
    def after_declare_actor(self, broker: Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        # The job ends in its own frame (cancellation.guarded), so a forced
        # stop can never land after its code is done.
        if not getattr(actor.fn, "cancellation_guarded", False):
            actor.fn = guarded(actor.fn)

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        registry.enter(message.message_id)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        try:
            running = registry.leave()
        except JobCancelled:  # a last guard: a stop must never escape into the worker
            running = None
        if isinstance(exception, JobForceCancelled):
            # Stopped wherever it was, maybe inside a query or a transaction:
            # its connections are not trusted for the next job. (A Redis
            # connection cut mid-command is dropped by redis-py itself.)
            db.connections.close_all()
        elif running is not None:
            try:
                progress.flush(running)
            except Exception:  # best effort, as every progress write
                logger.warning("Last progress report of %s not written", message.message_id)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        with contextlib.suppress(JobCancelled):
            registry.leave()
