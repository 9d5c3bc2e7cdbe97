"""The audit trail: one ``AuditEntry`` per operator action, from the admin or the CLI.

Who (the admin user's name, or ``os:<user>`` for ``manage.py jobs``), when,
which action, on what (a queue, an actor, a filter) and which jobs: the first
``MAX_IDS`` message ids, enough for a job's page to list the actions that
named it (``naming``) without a row per job. Recording never stops the action
it records: a database that refuses the write costs the entry, logged, not the
retry or cancel the operator asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import django.db
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs.models import AuditEntry, Job

logger = logging.getLogger("jobs.audit")
MAX_IDS = 1_000
MAX_TEXT = 300


def who_in(request: HttpRequest) -> str:
    user = getattr(request, "user", None)
    return user.get_username() if user is not None and user.is_authenticated else "anonymous"


def record(
    action: str,
    *,
    who: str,
    source: str = "admin",
    target: str = "",
    message_ids: Iterable[str] = (),
    count: int | None = None,
    note: str = "",
) -> AuditEntry | None:
    """Write one entry; ``count`` defaults to the number of ``message_ids``."""
    ids = list(dict.fromkeys(message_ids))
    entry = AuditEntry(
        who=who[:150],
        source=source,
        action=action[:40],
        target=target[:MAX_TEXT],
        count=len(ids) if count is None else count,
        message_ids=" ".join(ids[:MAX_IDS]),
        note=note[:MAX_TEXT],
    )
    try:
        entry.save()
    except django.db.Error as exc:
        logger.warning("audit entry not written (%s): %s %s by %s", exc, action, target, who)
        return None
    return entry


def first_ids(queryset: QuerySet[Job]) -> list[str]:
    """The message ids an entry keeps of ``queryset``, read before acting on it."""
    return list(queryset.order_by("-id").values_list("message_id", flat=True)[:MAX_IDS])


def naming(message_id: str, limit: int = 50) -> QuerySet[AuditEntry]:
    """The newest entries that name the job ``message_id``.

    A substring search: the table holds one row per operator action, small
    beside the ledger, and the UUID cannot occur inside another id.
    """
    return AuditEntry.objects.filter(message_ids__contains=message_id).order_by("-id")[:limit]
