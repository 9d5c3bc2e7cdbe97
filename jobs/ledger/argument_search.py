"""Find jobs by what they were called with: ``user_id=7``, ``order.number=A-12``.

A term ``path=value`` asks for the jobs whose argument ``path`` (a parameter's
name, then keys into nested objects, dot-separated) equals ``value``: ``7``
finds the number 7 and the text "7", ``true``/``false``/``null`` the JSON value
and the text, ``"7"`` in quotes only the text, anything else is text.

Each actor that takes an argument of that name is searched its own way:

- **indexed, at any age**, when the actor declares the path in ``search_by``
  (or, for a plain name, in ``refers_to``): its jobs' values are
  ``JobReference`` rows (``order.number=A-12``, ``auth.user:7``), written once
  with each job, so the search is a B-tree lookup on any size of ledger;
- **otherwise among the newest ``RECENT_ROWS`` jobs**: a positional argument is
  found at its position in the stored ``args`` (the actor's signature names
  it), a keyword one in ``kwargs``; a scan, bounded like the free-text search.

Why not a JSON column with a GIN index on every job: measured (the ledger's
own batch writes, 150 jobs per batch), storing every argument by name cost 3.7 %
of a job's whole CPU on SQLite and 7.3 % on PostgreSQL, the GIN entries paid
again at each of a job's state updates; the issue's bound was 2 %. Declared
paths cost one index row per value, once, and only for the actors that ask.

The newest ``MAX_IDS`` matches are listed (ids first, then the page), so that
neither database walks the primary key backwards testing every row.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import dramatiq
from django.db.models import JSONField, Q, QuerySet, Value
from django.db.models.fields.json import KeyTransform

from jobs.ledger import references
from jobs.models import Job, JobReference

TERM = re.compile(r"(?P<path>[A-Za-z_]\w*(?:\.\w+)*)=(?P<value>.*)", re.DOTALL)
RECENT_ROWS = 100_000
MAX_IDS = 10_000
_KEYWORDS: dict[str, Any] = {"true": True, "false": False, "null": None}


@dataclass(frozen=True)
class ArgumentTerm:
    path: tuple[str, ...]
    values: tuple[Any, ...]  # any of them matches

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


def parse(term: str) -> ArgumentTerm | None:
    """``path=value`` as an ``ArgumentTerm``; None for any other search text."""
    match = TERM.fullmatch(term.strip())
    if match is None:
        return None
    path = tuple(match["path"].split("."))
    text = match["value"].strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return ArgumentTerm(path, (text[1:-1],))
    if text in _KEYWORDS:
        return ArgumentTerm(path, (_KEYWORDS[text], text))
    number = _number(text)
    return ArgumentTerm(path, (text,) if number is None else (number, text))


def _number(text: str) -> int | float | None:
    if re.fullmatch(r"-?\d{1,18}", text):
        return int(text)
    if re.fullmatch(r"-?\d{1,18}\.\d{1,18}", text):
        number = float(text)
        return number if math.isfinite(number) else None  # JSON has no Infinity
    return None


@dataclass
class _Plan:
    subjects: set[str]  # indexed: JobReference rows
    scans: list[Q]  # not indexed: conditions on args/kwargs of recent rows


def _json_equals(alias: str, value: Any) -> Q:
    # JSON null is Value(None, JSONField()): a bare None would mean SQL NULL
    return Q(**{alias: Value(None, JSONField()) if value is None else value})


def _path(column: str, keys: list[str]) -> Any:
    # expressions, not "kwargs__user_id": a key may be named like a lookup ("exact")
    expression: Any = column
    for key in keys:
        expression = KeyTransform(key, expression)
    return expression


def _plan(term: ArgumentTerm) -> tuple[_Plan, dict[str, Any]]:
    plan, aliases = _Plan(set(), []), dict[str, Any]()
    first, rest = term.path[0], list(term.path[1:])
    references.discover()
    for name, actor in sorted(dramatiq.get_broker().actors.items()):
        positions = references.positional_parameters(actor.fn)
        if first not in positions and first not in references.keyword_parameters(actor.fn):
            continue
        if term.dotted in references.searchable(actor):
            plan.subjects.update(references.argument_subject(term.dotted, v) for v in term.values)
            continue
        label = references.declared(actor).get(first)
        if label is not None and not rest:
            plan.subjects.update(
                references.subject_key(label, v)
                for v in term.values
                if isinstance(v, int | str) and not isinstance(v, bool)
            )
            continue
        by_keyword = f"_kw{len(aliases)}"
        aliases[by_keyword] = _path("kwargs", [first, *rest])
        found = Q()
        for value in term.values:
            found |= _json_equals(by_keyword, value)
        if first in positions:
            by_position = f"_pos{len(aliases)}"
            aliases[by_position] = _path("args", [str(positions.index(first)), *rest])
            for value in term.values:
                found |= _json_equals(by_position, value)
        plan.scans.append(Q(actor_name=name) & found)
    return plan, aliases


def matching(queryset: QuerySet[Job], term: ArgumentTerm) -> QuerySet[Job]:
    """The jobs of ``queryset`` whose argument at ``term.path`` is one of its values."""
    plan, aliases = _plan(term)
    if len(plan.subjects) == 1 and not plan.scans:
        return references.jobs_naming(queryset, plan.subjects.pop())  # lazy, any number
    ids: set[int] = set()
    if plan.subjects:
        ids.update(
            JobReference.objects.filter(subject__in=plan.subjects, job__in=queryset)
            .order_by("-job_id")
            .values_list("job_id", flat=True)[:MAX_IDS]
        )
    if plan.scans:
        newest = Job.objects.order_by("-id").values_list("id", flat=True).first() or 0
        condition = Q()
        for scan in plan.scans:
            condition |= scan
        recent = queryset.filter(pk__gt=newest - RECENT_ROWS).alias(**aliases)
        ids.update(recent.filter(condition).order_by("-id").values_list("id", flat=True)[:MAX_IDS])
    newest_ids = sorted(ids, reverse=True)[:MAX_IDS]
    if not newest_ids:
        return queryset.none()
    return queryset.filter(pk__in=newest_ids, pk__gte=newest_ids[-1], pk__lte=newest_ids[0])
