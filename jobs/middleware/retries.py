"""Retries with exponential backoff that tell permanent failures from transient.

Dramatiq's stock middleware retries every exception. Ours reads its defaults
from Django settings (``JOBS_MAX_RETRIES``, ``JOBS_MIN_BACKOFF_MS``,
``JOBS_MAX_BACKOFF_MS``) and never retries a ``PermanentJobError``, whatever the
actor's ``throws`` says. The schedule is Dramatiq's: retry *n* waits between
``min * 2**(n-1)`` and twice that (jitter, so a burst of failures does not come
back in lock-step): 5-10 s, 10-20 s, 20-40 s ... for a 5 s minimum.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import retries as stock

from jobs.errors import is_permanent


class Retries(stock.Retries):
    def __init__(self, **options: Any) -> None:
        options.setdefault("max_retries", settings.JOBS_MAX_RETRIES)
        options.setdefault("min_backoff", settings.JOBS_MIN_BACKOFF_MS)
        options.setdefault("max_backoff", settings.JOBS_MAX_BACKOFF_MS)
        super().__init__(**options)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        if exception is not None and is_permanent(exception):
            self.logger.warning(
                "Permanent failure of message %r (%s): not retried.",
                message.message_id,
                exception,
            )
            message.fail()
            return
        super().after_process_message(  # type: ignore[no-untyped-call]
            broker, message, result=result, exception=exception
        )
