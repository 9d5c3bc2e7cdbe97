"""Stopping a running job: cooperatively first, by force after a grace period.

An operator's cancel (the admin, ``manage.py jobs cancel``) marks the message id
in Redis (``jobs.broker.queues.cancel``), as for a waiting job. Each worker
process keeps the jobs it runs now in a registry; one watcher thread per
process asks Redis, every ``JOBS_CONTROL_REFRESH_MS`` and only while jobs run,
which of them were cancelled (one pipelined ZSCORE per running job). A job
found there:

1. is flagged: its next ``check()`` raises ``JobCancelled``. The toolkit calls
   ``check()`` for the job at its natural stopping points (a checkpoint saved,
   progress reported, a lock checked or waited for), and a job may call it in
   its own loop. The job unwinds through its ``with`` blocks: locks released,
   a ``run_once`` claim given back (its effect did not finish), no retry.
2. if still running ``JOBS_CANCEL_GRACE_MS`` later, has ``JobForceCancelled``
   raised in its thread, as Dramatiq's time limit does. Its database
   connections are closed afterwards (it may have been stopped inside a
   query), and an effect it may have started stays claimed.

A worker killed meanwhile leaves the mark in Redis: the redelivered message is
skipped by ``jobs.middleware.control`` and recorded "cancelled" as well.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from dramatiq.middleware import raise_thread_exception

from jobs.conf import jobs_settings
from jobs.errors import JobCancelled, JobForceCancelled

logger = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Running:
    """One job this process runs now."""

    message_id: str
    thread_id: int
    cancelled_at: float | None = None  # monotonic, when this process saw the cancel
    # Set under the registry's mutex. A job is forced only while neither of
    # these is set, so a forced stop never lands once its code is done.
    stopping: bool = False  # its own check() raised JobCancelled: it is unwinding
    ended: bool = False  # its function returned or raised
    forced: bool = False
    depth: int = 0  # actor calls in progress in this thread (a job may call another)
    progress: object = None  # jobs.runtime.progress's throttle state


class Registry:
    """The running jobs of this process, by thread, and the watcher that stops them."""

    def __init__(self) -> None:
        self._by_thread: dict[int, Running] = {}
        # Held while a job is forced and while it ends: an exception is never
        # raised into a thread whose job has ended.
        self._mutex = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._stopping = threading.Event()

    def enter(self, message_id: str) -> None:
        thread_id = threading.get_ident()
        with self._mutex:
            self._by_thread[thread_id] = Running(message_id, thread_id)
        self._ensure_watcher()

    def end(self) -> None:
        """Called in the job's own frame as its function returns or raises
        (``guarded``): from here on it is never forced. A forced stop set just
        before lands here, still inside the job's call, or is withdrawn."""
        thread_id = threading.get_ident()
        with self._mutex:
            running = self._by_thread.get(thread_id)
            if running is None or running.ended:
                return
            running.ended = True
            if running.forced:
                _clear_pending_exception(thread_id)

    def stop_cooperatively(self) -> None:
        """This thread's job saw its cancel and raises: no force needed any more."""
        with self._mutex:
            running = self._by_thread.get(threading.get_ident())
            if running is not None:
                running.stopping = True

    def leave(self) -> Running | None:
        """Take this thread's job out (its after hooks run)."""
        thread_id = threading.get_ident()
        with self._mutex:
            running = self._by_thread.pop(thread_id, None)
            if running is not None and running.forced and not running.ended:
                # Ended outside ``guarded`` (an actor not declared through the
                # broker): withdraw a stop that has not landed.
                _clear_pending_exception(thread_id)
        return running

    def current(self) -> Running | None:
        return self._by_thread.get(threading.get_ident())

    def running_ids(self) -> list[str]:
        with self._mutex:
            return [r.message_id for r in self._by_thread.values()]

    def _ensure_watcher(self) -> None:
        if self._watcher is not None and self._watcher.is_alive():
            return
        with self._mutex:
            if self._watcher is not None and self._watcher.is_alive():
                return
            self._stopping.clear()
            self._watcher = threading.Thread(target=self._watch, name="job-cancel", daemon=True)
            self._watcher.start()

    def stop(self) -> None:
        self._stopping.set()

    def _watch(self) -> None:
        while not self._stopping.wait(max(jobs_settings.JOBS_CONTROL_REFRESH_MS, 50) / 1000):
            try:
                self.poll()
            except Exception:  # Redis away: the next round asks again
                logger.warning("Could not read job cancels", exc_info=True)

    def poll(self) -> None:
        """One round: flag the newly cancelled jobs, force those past their grace."""
        from jobs.broker import queues

        with self._mutex:
            waiting = [r for r in self._by_thread.values() if r.cancelled_at is None]
        if waiting:
            cancelled = queues.cancelled_among([r.message_id for r in waiting])
            now = time.monotonic()
            for running in waiting:
                if running.message_id in cancelled:
                    running.cancelled_at = now
                    logger.info("Job %s cancelled; asking it to stop", running.message_id)
        grace = jobs_settings.JOBS_CANCEL_GRACE_MS / 1000
        with self._mutex:
            for running in self._by_thread.values():
                due = (
                    running.cancelled_at is not None
                    and time.monotonic() - running.cancelled_at >= grace
                )
                if due and not (running.forced or running.stopping or running.ended):
                    running.forced = True
                    logger.warning(
                        "Job %s did not stop within %.1f s of its cancel; stopping it by force",
                        running.message_id,
                        grace,
                    )
                    raise_thread_exception(running.thread_id, JobForceCancelled)  # type: ignore[no-untyped-call]


def guarded(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` (an actor's function) ending in its own frame: see ``Registry.end``."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        running = registry.current()
        if running is not None:
            running.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            # Only the outermost call ends the job: an actor the job calls
            # directly returns inside it.
            if running is not None:
                running.depth -= 1
                if running.depth == 0:
                    registry.end()

    run.cancellation_guarded = True  # type: ignore[attr-defined]
    return run


def _clear_pending_exception(thread_id: int) -> None:
    """Withdraw an exception set for ``thread_id`` that it has not raised yet
    (CPython's ``PyThreadState_SetAsyncExc`` with NULL; a no-op if none is pending)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.c_long(0))


registry = Registry()


def requested() -> bool:
    """Whether the job running in this thread has been cancelled."""
    running = registry.current()
    return running is not None and running.cancelled_at is not None


def check() -> None:
    """Raise ``JobCancelled`` if the job running in this thread has been cancelled.

    Outside a worker (a shell, a test calling the function) it does nothing.
    """
    if requested():
        registry.stop_cooperatively()
        raise JobCancelled("cancelled by an operator")
