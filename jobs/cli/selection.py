"""Which jobs a command means: ids, or the filters of the admin's job list.

Ids are ledger ids (the number in the admin's URL, ``/admin/jobs/job/42/``) or
message ids (the UUID Dramatiq gives a message); a number is never a UUID, so
both can be mixed. Filters combine as the admin's do (all must hold); the
search reads like the admin's ``?q=``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.text import smart_split, unescape_string_literal

from jobs.ledger import argument_search
from jobs.ledger.references import jobs_naming, subject_key
from jobs.models import Job

# The admin's search rules (jobs.admin.jobs), kept here rather than imported:
# the command must work in a project that does not install the admin.
MESSAGE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
SUBJECT = re.compile(r"[a-z_][\w]*\.[a-z_][\w]*:\S+", re.IGNORECASE)
LEDGER_ID = re.compile(r"[0-9]{1,18}")
ARGUMENT_SEARCH_ROWS = 100_000


class SelectionError(ValueError):
    """Ids or filter values that cannot be read: a usage error."""


def parse_when(text: str, option: str) -> datetime:
    """An ISO date or datetime; one without an offset is in ``TIME_ZONE``, as the admin shows."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise SelectionError(
            f"{option} takes an ISO date or datetime (2026-12-01, 2026-12-01T08:30, "
            f"2026-12-01T08:30:00+01:00), not {text!r}"
        ) from None
    return timezone.make_aware(when) if timezone.is_naive(when) else when


def parse_ids(tokens: list[str]) -> tuple[str, ...]:
    bad = [t for t in tokens if not (LEDGER_ID.fullmatch(t) or MESSAGE_ID.fullmatch(t))]
    if bad:
        raise SelectionError(
            f"not a ledger id (a number) or a message id (a UUID): {', '.join(map(repr, bad))}"
        )
    return tuple(dict.fromkeys(t.lower() for t in tokens))


def search(queryset: QuerySet[Job], term: str) -> QuerySet[Job]:
    """The admin's ``?q=``: a message id, an object such as ``auth.user:7`` or an
    argument such as ``user_id=7`` (see ``argument_search``), else each
    word in the actor name, arguments or message id of the newest
    ``ARGUMENT_SEARCH_ROWS`` jobs (a substring search reads every row it covers)."""
    term = term.strip()
    if MESSAGE_ID.fullmatch(term):
        return queryset.filter(message_id=term.lower())
    if SUBJECT.fullmatch(term):
        label, _, object_id = term.partition(":")
        return jobs_naming(queryset, subject_key(label, object_id))
    if (argument := argument_search.parse(term)) is not None:
        return argument_search.matching(queryset, argument)
    newest = Job.objects.order_by("-id").values_list("id", flat=True).first() or 0
    queryset = queryset.filter(pk__gt=newest - ARGUMENT_SEARCH_ROWS)
    for bit in smart_split(term):
        if bit[:1] in ('"', "'") and bit[-1:] == bit[:1]:
            bit = unescape_string_literal(bit)
        queryset = queryset.filter(
            Q(message_id__iexact=bit)
            | Q(actor_name__icontains=bit)
            | Q(args__icontains=bit)
            | Q(kwargs__icontains=bit)
        )
    return queryset


@dataclass(frozen=True)
class Selection:
    ids: tuple[str, ...] = ()
    actor: str | None = None
    queue: str | None = None
    state: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    search: str | None = None

    def __post_init__(self) -> None:
        if self.ids and self.filters():
            raise SelectionError("give ids or filters, not both")
        # PostgreSQL cannot compare a NUL character: a usage error, not a crash.
        if any("\x00" in value for value in (*self.ids, *self.filters().values())):
            raise SelectionError("a NUL character is not allowed in an id or a filter")

    @property
    def is_empty(self) -> bool:
        return not self.ids and not self.filters()

    def filters(self) -> dict[str, str]:
        """The filters given, as typed (for messages, the audit line and JSON)."""
        values = {
            "actor": self.actor,
            "queue": self.queue,
            "state": self.state,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "search": self.search,
        }
        return {name: value for name, value in values.items() if value}

    def describe(self) -> dict[str, Any]:
        if self.ids:
            return {"ids": list(self.ids)}
        return self.filters() or {"all": True}

    def __str__(self) -> str:
        if self.ids:
            return f"{len(self.ids)} id(s)"
        return " ".join(f"{k}={v!r}" for k, v in self.filters().items()) or "(no filter)"

    def _by_id(self) -> Q:
        numbers = [int(i) for i in self.ids if LEDGER_ID.fullmatch(i)]
        uuids = [i for i in self.ids if MESSAGE_ID.fullmatch(i)]
        return Q(pk__in=numbers) | Q(message_id__in=uuids)

    def jobs(self, states: tuple[str, ...]) -> QuerySet[Job]:
        """The selected jobs among those in ``states`` (the states the command acts on)."""
        queryset = Job.objects.filter(state__in=states)
        if self.ids:
            return queryset.filter(self._by_id())
        if self.state:
            queryset = queryset.filter(state=self.state)
        if self.actor:
            queryset = queryset.filter(actor_name=self.actor)
        if self.queue:
            queryset = queryset.filter(queue_name=self.queue)
        # enqueued_at, as the admin's date filter: indexed alone and with the state.
        if self.since:
            queryset = queryset.filter(enqueued_at__gte=self.since)
        if self.until:
            queryset = queryset.filter(enqueued_at__lt=self.until)
        if self.search:
            queryset = search(queryset, self.search)
        return queryset

    def left_out(self, states: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
        """The ids given that name no job, and those whose job is in another state."""
        if not self.ids:
            return [], {}
        found: dict[str, str] = {}
        for pk, message_id, state in Job.objects.filter(self._by_id()).values_list(
            "pk", "message_id", "state"
        ):
            found[str(pk)] = found[message_id] = state
        missing = [i for i in self.ids if i not in found]
        elsewhere = {i: found[i] for i in self.ids if i in found and found[i] not in states}
        return missing, elsewhere
