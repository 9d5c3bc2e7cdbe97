"""A daemon thread that writes a process's buffered figures to its metrics.

For counters kept in memory on a hot path (``jobs.observability.deferred``,
``jobs.consistency.locks``): ``flush()`` every ``FLUSH_INTERVAL`` seconds from
the first ``_ensure_flusher()`` on, and once more at exit: through ``atexit``
for a plain interpreter, and through multiprocessing's finalizers for a
process it started (dramatiq's worker processes), which ends with
``os._exit`` and never runs ``atexit`` handlers, even after ``sys.exit``.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import threading
import time
from abc import ABC, abstractmethod

logger = logging.getLogger(__name__)


class PeriodicFlush(ABC):
    FLUSH_INTERVAL = 1.0  # seconds
    flusher_name = "metrics-flush"
    _flusher: threading.Thread | None = None
    _exit_flush_registered = False

    @abstractmethod
    def flush(self) -> None:
        """Write what was counted in memory to the metrics."""

    def _ensure_flusher(self) -> None:
        if self._flusher is not None:
            return
        with _starting:
            if self._flusher is not None:
                return
            if not self._exit_flush_registered:
                atexit.register(self.flush)
                self._exit_flush_registered = True
            # In every process that starts a flusher: a finalizer registered
            # before a fork is skipped in the child.
            multiprocessing.util.Finalize(None, self.flush, exitpriority=100)
            self._flusher = threading.Thread(target=self._run, name=self.flusher_name, daemon=True)
            self._flusher.start()

    def _forget_flusher(self) -> None:
        """In a forked child: threads do not survive a fork (the exit flush does)."""
        global _starting
        _starting = threading.Lock()  # the parent's may have been held at the fork
        self._flusher = None

    def _run(self) -> None:
        while True:
            time.sleep(self.FLUSH_INTERVAL)
            try:
                self.flush()
            except Exception:  # a metrics file problem must not end the flushing
                logger.exception("Flushing %s failed", self.flusher_name)


_starting = threading.Lock()
