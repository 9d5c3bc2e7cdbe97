"""Checkpoints: a multi-step job records each finished step; a retry skips them.

    for step in ("fetch", "render", "store"):
        if checkpoints.done(step):
            continue
        ...do the step...
        checkpoints.save(step, {"rows": 42}, total=3)

Steps are stored per message id (``JobCheckpoint``), written at once (not
batched like the ledger) so a retry of the same message, on any worker, sees
them. The admin's job page lists them.

With ``total`` (the number of steps), a save reports progress as well
(``jobs.runtime.progress``): steps saved so far of ``total``, noted with the
step's name. A retry that skips its finished steps starts from there. Each save
is also a cancellation check point: a cancelled job stops after a finished
step, before the next.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from dramatiq.middleware import CurrentMessage

from jobs.models import JobCheckpoint
from jobs.runtime import cancellation, progress


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


def save(
    step: str | int,
    payload: Any = None,
    *,
    message_id: str | None = None,
    total: int | None = None,
) -> None:
    """Record ``step`` as finished (idempotent: a second save keeps the first);
    with ``total``, report progress too (steps saved of ``total``)."""
    mid = _message_id(message_id)
    try:
        with transaction.atomic():
            JobCheckpoint.objects.create(message_id=mid, step=str(step), data=payload or {})
    except IntegrityError:
        pass
    if total is not None:
        saved = JobCheckpoint.objects.filter(message_id=mid).count()
        progress.report(min(saved, total), total, f"step {step} done")
    else:
        cancellation.check()


def completed(*, message_id: str | None = None) -> list[str]:
    return list(
        JobCheckpoint.objects.filter(message_id=_message_id(message_id)).values_list(
            "step", flat=True
        )
    )
