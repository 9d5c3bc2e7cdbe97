"""An operator's cancel is not a crash: Dramatiq's "Failed to process message ...
with unhandled exception" (ERROR, with a traceback) becomes one INFO line for a
job stopped by ``JobCancelled``, so error trackers and log alerts stay quiet."""

from __future__ import annotations

import logging

from jobs.errors import JobCancelled

# The logger Dramatiq's worker threads report a job's exception on.
WORKER_THREAD_LOGGER = "dramatiq.worker.WorkerThread"


class CancelledJobFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        if info and isinstance(info[1], JobCancelled):
            how = "by force" if info[1].forced else "cleanly"
            record.msg = "Job %s stopped %s: cancelled by an operator."
            subject = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.args = (subject, how)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info = record.exc_text = None
        return True


def install() -> None:
    """On the worker threads' logger (a logger filter sees only its own records)."""
    logger = logging.getLogger(WORKER_THREAD_LOGGER)
    if not any(isinstance(f, CancelledJobFilter) for f in logger.filters):
        logger.addFilter(CancelledJobFilter())
