"""Prometheus figures per actor, recorded in whichever process sees the event.

Listed before Retries: after_* hooks run in reverse order, so ``message.failed``
already tells a final failure from one that will be retried. A deferral (a full
rate limit) is neither: it is counted apart, as no attempt and no retry.
"""

from __future__ import annotations

import os
import time
from typing import Any

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name

from jobs.broker.workers import Heartbeat
from jobs.errors import is_deferral
from jobs.observability import metrics


class Metrics(dramatiq.Middleware):
    def __init__(self) -> None:
        self._started: dict[str, float] = {}
        self._heartbeat: Heartbeat | None = None

    def after_enqueue(self, broker: Broker, message: dramatiq.Message[Any], delay: int) -> None:
        if message.options.get("retries") is None:  # retries are counted where they fail
            metrics.ENQUEUED.labels(message.actor_name, q_name(message.queue_name)).inc()

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        self._started[message.message_id] = time.perf_counter()
        metrics.IN_PROGRESS.labels(message.actor_name, q_name(message.queue_name)).inc()

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        labels = (message.actor_name, q_name(message.queue_name))
        metrics.IN_PROGRESS.labels(*labels).dec()
        started = self._started.pop(message.message_id, None)
        if is_deferral(exception) and not message.failed:
            metrics.DEFERRED.labels(*labels).inc()
            return
        if started is not None:
            metrics.DURATION.labels(*labels).observe(time.perf_counter() - started)
        if exception is None:
            outcome = "succeeded"
        elif message.failed:
            outcome = "failed"
        else:
            outcome = "retried"
            metrics.RETRIES.labels(*labels).inc()
        metrics.JOBS.labels(*labels, outcome).inc()

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        labels = (message.actor_name, q_name(message.queue_name))
        if message.message_id in self._started:  # skipped after before_process ran
            self._started.pop(message.message_id)
            metrics.IN_PROGRESS.labels(*labels).dec()
        if not message.options.get("paused_requeue"):
            metrics.JOBS.labels(*labels, "skipped").inc()

    def after_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        self._heartbeat = Heartbeat()
        self._heartbeat.start()

    def after_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            pid = metrics.process_identifier()
            multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
