"""Actors of the accounts app (autodiscovered by ``rundramatiq``)."""

from __future__ import annotations

import dramatiq

from accounts.services import welcome_email_send
from jobs.errors import PermanentJobError


@dramatiq.actor(queue_name="emails", time_limit=60_000)
def send_welcome_email(user_id: int) -> None:
    # JSON payloads can carry anything: reject a wrong type before touching data.
    if type(user_id) is not int:
        raise PermanentJobError(f"user_id must be an integer, got {user_id!r}")
    welcome_email_send(user_id=user_id)
