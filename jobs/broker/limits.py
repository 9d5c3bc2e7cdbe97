"""The size limit of a message, checked when it is sent (by the Payloads middleware
and by the outbox, in the request, so a huge payload never reaches Redis)."""

from __future__ import annotations

from typing import Any

import dramatiq
from django.conf import settings
from dramatiq.middleware import MiddlewareError


class PayloadTooLarge(ValueError, MiddlewareError):
    """Refused at send time: the encoded message exceeds JOBS_MAX_PAYLOAD_BYTES."""


def check_size(message: dramatiq.Message[Any]) -> None:
    size = len(message.encode())
    if size > settings.JOBS_MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"{message.actor_name} message is {size} bytes; the limit is "
            f"{settings.JOBS_MAX_PAYLOAD_BYTES} (JOBS_MAX_PAYLOAD_BYTES). Pass ids, not data."
        )
