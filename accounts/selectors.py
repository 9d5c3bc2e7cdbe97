"""Reads of the accounts app. Cached reads are invalidated by ``accounts.signals``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model

from accounts.models import TaskRequest
from jobs.consistency.cache import cache_loader, cached
from jobs.ledger import states
from jobs.tasks_framework.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from jobs.tasks_framework.results import retry_chain, retry_origins

User = get_user_model()

PROFILE_NAMESPACE = "user-profile"


class UserNotFound(Exception):
    pass


class TaskNotFound(Exception):
    """No such task, or not one this user asked for (the same answer for both)."""


def _profile_ttl() -> float:
    return float(getattr(settings, "USER_PROFILE_CACHE_TTL", 300))


@cache_loader(PROFILE_NAMESPACE, ttl=300)
def user_profile_load(key: str) -> dict[str, Any] | None:
    """The public profile of user ``key``; None if there is no such user.

    Public, so the address and other private fields stay out of it (the endpoint
    needs no login).
    """
    user = User.objects.filter(pk=int(key)).first()
    if user is None:
        return None
    joined = getattr(user, "date_joined", None)
    return {
        "id": user.pk,
        "username": user.get_username(),
        "first_name": getattr(user, "first_name", ""),
        "date_joined": joined.isoformat() if joined is not None else None,
    }


def user_profile(user_id: int) -> dict[str, Any]:
    """The public profile of ``user_id``, served from the cache; ``UserNotFound`` if none."""
    key = str(user_id)
    profile = cached(PROFILE_NAMESPACE, key, lambda: user_profile_load(key), ttl=_profile_ttl())
    if profile is None:
        raise UserNotFound(user_id)
    return profile


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def task_status(*, user_id: int, task_id: str) -> dict[str, Any]:
    """A task's state as its requester may see it; ``TaskNotFound`` for anyone else.

    An operator's retry of the task (from the admin) continues it: the id the
    requester was given shows the latest retry's state and names it in
    ``retried_as``, and the retry's own id is theirs to read too.
    """
    # Only ids an operator's retry derives from the request (retry_of), newest first.
    asked_for = retry_origins(task_id)
    if not TaskRequest.objects.filter(task_id__in=asked_for, requested_by_id=user_id).exists():
        raise TaskNotFound(task_id)
    try:
        result = task_backends["default"].get_result(task_id)
    except TaskResultDoesNotExist:
        raise TaskNotFound(task_id) from None
    chain = retry_chain(task_id)
    data: dict[str, Any] = {
        "id": result.id,
        "task": result.task.name,
        "status": str(result.status),
        "enqueued_at": _iso(result.enqueued_at),
        "started_at": _iso(result.started_at),
        "finished_at": _iso(result.finished_at),
        "attempts": result.attempts,
    }
    if len(chain) > 1:
        data["retried_as"] = chain[-1].message_id
    latest = chain[-1] if chain else None
    if latest is not None and latest.progress_done is not None:
        # What the job reported (jobs.runtime.progress); a retry keeps it.
        data["progress"] = {
            "done": latest.progress_done,
            "total": latest.progress_total,
            "note": latest.progress_note or "",
        }
    if latest is not None and latest.state == states.CANCELLED:
        data["cancelled"] = True
    if result.status == TaskResultStatus.SUCCESSFUL:
        data["result"] = result.return_value
    elif result.status == TaskResultStatus.FAILED and result.errors:
        # The class and last line only: a client gets what failed, not our internals.
        error = result.errors[-1]
        lines = error.traceback.strip().splitlines()
        data["error"] = {"type": error.exception_class_path, "message": lines[-1] if lines else ""}
    return data
