"""Actors of the accounts app (autodiscovered by ``rundramatiq``)."""

from __future__ import annotations

from typing import Any

import dramatiq
from django.conf import settings

from accounts import selectors  # noqa: F401 - registers the cache loaders for warm-up jobs
from accounts.services import user_export_build, welcome_email_send
from jobs.consistency.ratelimits import rate_limited
from jobs.tasks_framework.compat import task


def _welcome_email_rate() -> int:
    return int(getattr(settings, "WELCOME_EMAIL_RATE_PER_SECOND", 10))


# refers_to: the admin links this job to the user, and the user to their jobs.
@dramatiq.actor(queue_name="emails", time_limit=60_000, refers_to={"user_id": "auth.User"})
# The mail provider's rate: over it the job is delayed and retried, never failed.
@rate_limited("welcome-email", limit=_welcome_email_rate)
def send_welcome_email(user_id: int) -> None:
    # The Payloads middleware has checked user_id against the annotation: a
    # payload that is not an int failed permanently before reaching here.
    welcome_email_send(user_id=user_id)


# A Django task (django.tasks API) on the same workers; its return value is the
# result a client reads from GET /api/tasks/<id>/.
@task(queue_name="exports")
def user_export(user_id: int) -> dict[str, Any]:
    return user_export_build(user_id=user_id)
