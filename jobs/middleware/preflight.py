"""A worker process refuses to start on a database with unapplied migrations, or
without a broker (``DRAMATIQ_BROKER`` missing and the checks skipped).

Started anyway, it would run jobs whose ledger writes fail batch after batch (the
admin shows no jobs) and log a traceback for each. One line says what to run.
A database that cannot be reached is not a reason to refuse: the worker rides
out outages, and the ledger keeps its events until the database is back.

A worker, in-process or not, also takes the worker's Redis timeouts before its
threads start (``jobs.broker.timeouts``).
"""

from __future__ import annotations

import logging
import sys

import dramatiq
from django.db import DatabaseError
from dramatiq.brokers.redis import RedisBroker

from jobs.broker.timeouts import use_worker_timeouts
from jobs.broker.unconfigured import REFUSAL, UnconfiguredBroker
from jobs.conf.migrations import pending_migrations, refusal

logger = logging.getLogger(__name__)

# Dramatiq's exit code for a worker that could not load (dramatiq.cli.RET_IMPORT).
EXIT_NOT_READY = 2


class Preflight(dramatiq.Middleware):
    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        if isinstance(broker, UnconfiguredBroker):  # started with --skip-checks
            logger.critical(REFUSAL)
            sys.exit(EXIT_NOT_READY)
        try:
            pending = pending_migrations()
        except DatabaseError as exc:
            logger.warning("Could not check for unapplied migrations (%s); starting anyway", exc)
            return
        if pending:
            logger.critical(refusal(pending))
            sys.exit(EXIT_NOT_READY)

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        # Dramatiq's Worker.start() sends it before the consumers and worker
        # threads open connections (also for an in-process worker).
        if isinstance(broker, RedisBroker):
            use_worker_timeouts(broker)
