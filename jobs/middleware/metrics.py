"""Prometheus figures per actor, recorded in whichever process sees the event.

Written through ``jobs.observability.deferred``: a job's figures reach the
metrics files within a second, without every worker thread queueing on
prometheus' process-wide lock for each of them.

Listed before Retries: after_* hooks run in reverse order, so ``message.failed``
already tells a final failure from one that will be retried. A deferral (a full
rate limit) is neither: it is counted apart, as no attempt and no retry.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name

from jobs.broker import unknown_actors
from jobs.broker.pulse import pulse
from jobs.broker.workers import Heartbeat
from jobs.errors import is_cancel, is_deferral
from jobs.middleware.control import PAUSE_REQUEUES
from jobs.observability import metrics
from jobs.observability.deferred import writes


class Metrics(dramatiq.Middleware):
    def __init__(self) -> None:
        self._started: dict[str, float] = {}
        self._heartbeat: Heartbeat | None = None
        self._heartbeat_mutex = threading.Lock()
        self._workers: set[int] = set()  # booted and not yet shut down, in this process
        self._enqueued: dict[tuple[str, str], Any] = {}
        # (actor, queue) -> its children of the per-job figures, found once
        self._children: dict[tuple[str, str], _Children] = {}

    @property
    def forks(self) -> list[Callable[[], int]]:
        # rundramatiq runs it beside the workers: their heartbeat while a job
        # holds the GIL (jobs.broker.pulse).
        return [pulse]

    def after_enqueue(self, broker: Broker, message: dramatiq.Message[Any], delay: int) -> None:
        # Only a message sent for the first time: a retry is counted where it
        # failed, and a paused queue puts its messages back on every recheck.
        options = message.options
        if options.get("retries") is None and not (
            PAUSE_REQUEUES in options or unknown_actors.REQUEUES in options
        ):
            key = (message.actor_name, message.queue_name)
            counter = self._enqueued.get(key)
            if counter is None:
                # The child prometheus keeps for these labels, found once (labels()
                # takes a lock and checks its arguments on every send).
                counter = self._enqueued[key] = metrics.ENQUEUED.labels(
                    message.actor_name, q_name(message.queue_name)
                )
            writes.add(counter)

    def _of(self, message: MessageProxy) -> _Children:
        key = (message.actor_name, message.queue_name)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = _Children(message.actor_name, q_name(key[1]))
        return children

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        self._started[message.message_id] = time.perf_counter()
        writes.add(self._of(message).in_progress)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        children = self._of(message)
        started = self._started.pop(message.message_id, None)
        # Only a job this hook counted in: a middleware listed earlier whose
        # before_process_message raised (Control's Redis read in an outage) gets
        # after_process_message too, and an unmatched -1 left the gauge at -1.
        if started is not None:
            writes.add(children.in_progress, -1)
        if is_deferral(exception) and not message.failed:
            writes.add(children.deferred)
            return
        if started is not None:
            writes.observe(children.duration, time.perf_counter() - started)
        if exception is None:
            writes.add(children.succeeded)
        elif is_cancel(exception):
            writes.add(children.cancelled)
        elif message.failed:
            writes.add(children.failed)
        else:
            writes.add(children.retries)
            writes.add(children.retried)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        labels = (message.actor_name, q_name(message.queue_name))
        if message.message_id in self._started:  # skipped after before_process ran
            self._started.pop(message.message_id)
            writes.add(self._of(message).in_progress, -1)
        if not message.options.get("paused_requeue"):
            # A waiting job cancelled by an operator is "cancelled", as in the ledger.
            cancelled = message.options.get("skip_reason") == "cancelled"
            writes.add(metrics.JOBS.labels(*labels, "cancelled" if cancelled else "skipped"))

    def after_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        # One heartbeat per process (it beats for the broker id), however many
        # workers it runs: a second one must not replace, and so orphan, the
        # first's thread, which would beat on after every worker stopped.
        with self._heartbeat_mutex:
            self._workers.add(id(worker))
            if self._heartbeat is None:
                self._heartbeat = Heartbeat()
                self._heartbeat.start()
        _forget_live_gauges_at_exit()

    def after_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        writes.flush()  # its last jobs' figures, before a caller reads or the process ends
        with self._heartbeat_mutex:
            # By identity, not a count: a worker stopped twice (or never
            # booted) stopped the heartbeat under one still running, and
            # maintenance then took its broker id for dead.
            if id(worker) not in self._workers:
                return
            self._workers.discard(id(worker))
            if self._workers or self._heartbeat is None:
                return
            heartbeat, self._heartbeat = self._heartbeat, None
        heartbeat.stop()


class _Children:
    """One actor and queue's series of the per-job figures.

    ``labels()`` takes a lock and checks its arguments on every call: five
    calls per job, looked up once per actor instead.
    """

    def __init__(self, actor: str, queue: str) -> None:
        self.in_progress = metrics.IN_PROGRESS.labels(actor, queue)
        self.deferred = metrics.DEFERRED.labels(actor, queue)
        self.duration = metrics.DURATION.labels(actor, queue)
        self.retries = metrics.RETRIES.labels(actor, queue)
        self.succeeded = metrics.JOBS.labels(actor, queue, "succeeded")
        self.failed = metrics.JOBS.labels(actor, queue, "failed")
        self.retried = metrics.JOBS.labels(actor, queue, "retried")
        self.cancelled = metrics.JOBS.labels(actor, queue, "cancelled")


_exit_hook_registered = False


def _forget_live_gauges_at_exit() -> None:
    """Drop this process's live gauges (jobs_in_progress, ...) when it exits.

    At exit, not when a worker stops: ``mark_process_dead`` deletes the files
    this process keeps writing to, so a process that goes on after stopping a
    worker (a web process with an embedded worker, the tests) would vanish
    from every live gauge for the rest of its life.
    """
    global _exit_hook_registered
    if _exit_hook_registered or not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    from prometheus_client import multiprocess

    atexit.register(multiprocess.mark_process_dead, metrics.process_identifier())
    _exit_hook_registered = True
