"""Operator control from the admin: paused queues and cancelled messages.

Before a message runs, one Redis round trip asks whether its queue is paused or
the message was cancelled, and counts the delivery (the ledger's attempt number,
which also reveals a redelivery after a worker died). A cancelled message is
skipped (acked, recorded as skipped). A paused queue's message is put back with
a delay and the current delivery skipped quietly, so workers stop running that
queue's jobs without losing them, and pick them up again once it is resumed.
"""

from __future__ import annotations

import logging
from typing import Any

import dramatiq
from django.conf import settings
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import SkipMessage

from jobs import queues
from jobs.middleware.ledger import canonical_queue

logger = logging.getLogger(__name__)


class Control(dramatiq.Middleware):
    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        queue_name = canonical_queue(message.queue_name)
        try:
            paused, cancelled, delivery = queues.gate(queue_name, message.message_id)
        except Exception:  # Redis hiccup: run the job rather than stall the worker
            logger.warning("Could not read queue controls for %s", queue_name, exc_info=True)
            return
        if cancelled:
            message.options["skip_reason"] = "cancelled"
            raise SkipMessage("cancelled")
        if paused:
            requeue: dramatiq.Message[Any] = message.copy(queue_name=queue_name)
            broker.enqueue(requeue, delay=settings.JOBS_PAUSE_RECHECK_MS)
            message.options["paused_requeue"] = True
            raise SkipMessage("queue paused")
        message.options["delivery"] = delivery
