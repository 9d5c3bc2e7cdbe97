"""Operator control from the admin: paused queues and cancelled messages.

Each worker process reads the paused queues and the recently cancelled message
ids at most once per ``JOBS_CONTROL_REFRESH_MS`` (one Redis round trip), not
once per job, so control costs nothing on the hot path and takes effect within
that interval. A cancelled message is skipped (acked, recorded as skipped). A
paused queue's message is put back with a delay and the current delivery
skipped quietly, so workers stop running that queue's jobs without losing them,
and pick them up again once it is resumed. The copy put back counts its trips in
``pause_requeues``: it is the same job, not a new one, for metrics and the size
limit.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name
from dramatiq.middleware import SkipMessage

from jobs.broker import queues
from jobs.conf import jobs_settings

logger = logging.getLogger(__name__)

PAUSE_REQUEUES = "pause_requeues"


class Control(dramatiq.Middleware):
    def __init__(self) -> None:
        self._controls = queues.Controls(frozenset(), frozenset())
        self._read_at = float("-inf")
        self._mutex = threading.Lock()

    def _current(self) -> queues.Controls:
        now = time.monotonic()
        if now - self._read_at >= jobs_settings.JOBS_CONTROL_REFRESH_MS / 1000:
            with self._mutex:
                if now - self._read_at >= jobs_settings.JOBS_CONTROL_REFRESH_MS / 1000:
                    try:
                        self._controls = queues.controls()
                    except Exception:  # Redis hiccup: keep the last known controls
                        logger.warning("Could not read queue controls", exc_info=True)
                    self._read_at = now
        return self._controls

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        controls = self._current()
        if message.message_id in controls.cancelled:
            message.options["skip_reason"] = "cancelled"
            raise SkipMessage("cancelled")
        queue_name = q_name(message.queue_name)
        if queue_name in controls.paused:
            trips = int(message.options.get(PAUSE_REQUEUES, 0)) + 1
            requeue: dramatiq.Message[Any] = message.copy(
                queue_name=queue_name, options={PAUSE_REQUEUES: trips}
            )
            broker.enqueue(requeue, delay=jobs_settings.JOBS_PAUSE_RECHECK_MS)
            message.options["paused_requeue"] = True
            raise SkipMessage("queue paused")
