"""Checkpoints: a multi-step job records each finished step; a retry skips them.

    for step in ("fetch", "render", "store"):
        if checkpoints.done(step):
            continue
        ...do the step...
        checkpoints.save(step, {"rows": 42})

Steps are stored per message id (``JobCheckpoint``), written at once (not
batched like the ledger) so a retry of the same message, on any worker, sees
them. The admin's job page lists them.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from dramatiq.middleware import CurrentMessage

from jobs.models import JobCheckpoint


def _message_id(message_id: str | None) -> str:
    if message_id is not None:
        return message_id
    message = CurrentMessage.get_current_message()
    if message is None:
        raise RuntimeError("checkpoints need a running job (or an explicit message_id)")
    return str(message.message_id)


def done(step: str | int, *, message_id: str | None = None) -> bool:
    return JobCheckpoint.objects.filter(message_id=_message_id(message_id), step=str(step)).exists()


def data(step: str | int, *, message_id: str | None = None) -> Any:
    row = JobCheckpoint.objects.filter(message_id=_message_id(message_id), step=str(step)).first()
    return None if row is None else row.data


def save(step: str | int, payload: Any = None, *, message_id: str | None = None) -> None:
    """Record ``step`` as finished (idempotent: a second save keeps the first)."""
    try:
        with transaction.atomic():
            JobCheckpoint.objects.create(
                message_id=_message_id(message_id), step=str(step), data=payload or {}
            )
    except IntegrityError:
        pass


def completed(*, message_id: str | None = None) -> list[str]:
    return list(
        JobCheckpoint.objects.filter(message_id=_message_id(message_id)).values_list(
            "step", flat=True
        )
    )
