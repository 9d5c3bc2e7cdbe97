"""Frees a ``send_unique`` key when its message is finished for good.

Success is seen in ``after_process_message`` without an exception. A failure
ends for good when the message is nacked (permanent error, retries exhausted,
too old); a failure that is retried is acked and re-enqueued, so the key stays
claimed between retries. Hooking ``nack`` keeps this independent of where the
Retries middleware sits in the list. A skipped message (cancelled, a stale
periodic tick) is finished too, unless a paused queue only put it back for
later: that is still the same pending job.
"""

from __future__ import annotations

import dramatiq
from dramatiq.broker import MessageProxy

from jobs.consistency import dedup
from jobs.errors import is_cancel


class Dedup(dramatiq.Middleware):
    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: MessageProxy,
        *,
        result: object = None,
        exception: BaseException | None = None,
    ) -> None:
        # A job cancelled while running is acked, not nacked: finished too.
        if (exception is None or is_cancel(exception)) and not message.failed:
            self._clear(message)

    def after_nack(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._clear(message)

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        if not message.options.get("paused_requeue"):
            self._clear(message)

    def _clear(self, message: MessageProxy) -> None:
        key = message.options.get(dedup.OPTION)
        if key is not None:
            dedup.clear(key, message.message_id)
