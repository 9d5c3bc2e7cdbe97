"""The jobs this process runs now (``jobs.runtime``): a cancel can reach them, and
their last progress report is written when they end.

Last in ``DRAMATIQ_BROKER["MIDDLEWARE"]``: its before hook runs just before the
actor and its after hook first after it, so a forced stop can only be raised
while the job's own code runs, never into another middleware's hook.
"""

from __future__ import annotations

import logging
from typing import Any

import dramatiq
from django import db
from dramatiq.broker import Broker, MessageProxy

from jobs.errors import JobForceCancelled
from jobs.runtime import progress
from jobs.runtime.cancellation import registry

logger = logging.getLogger(__name__)


class RunningJobs(dramatiq.Middleware):
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
        running = registry.leave(exception)  # first: no forced stop can land after this
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
        registry.leave(None)
