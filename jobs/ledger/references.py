"""What a job's arguments refer to, as its actor declares it.

An actor names the model each id argument points at::

    @dramatiq.actor(queue_name="emails", refers_to={"user_id": "auth.User"})
    def send_welcome_email(user_id: int) -> None: ...

The platform never imports the product: this declaration is the only way it
learns that ``user_id`` is a user. The ledger stores every declared reference of
a job as a ``JobReference`` row (``"auth.user:7"``, indexed with the job), which
is how the admin finds one object's jobs on a large ledger: each object a job's
page links to, and each model with a "Jobs" link, finds the job.

An actor may also name arguments to find its jobs by, any value, nested keys
dot-separated::

    @dramatiq.actor(queue_name="orders", search_by=("customer", "order.number"))
    def ship(customer: str, order: dict) -> None: ...

Each value is stored the same way (``"order.number=A-12"``; a list gives one
row per element, a secret-looking value none), which ``user_id=7`` in the
admin's search finds at any age (``jobs.ledger.argument_search``). An index
row per declared value, written once with the job, is all it costs: the ledger
row itself, updated at each state, carries no index on the arguments.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import dramatiq
from django.apps import apps
from django.conf import settings
from django.db.models import QuerySet
from django.utils.module_loading import autodiscover_modules

from jobs.ledger.redaction import redact

if TYPE_CHECKING:
    from jobs.models import Job

OPTION = "refers_to"
SEARCH_OPTION = "search_by"
MAX_SUBJECT = 200
SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Reference:
    """One argument of one job that names an object."""

    argument: str
    model_label: str  # lower case, as Django's ``Model._meta.label_lower``
    object_id: str

    @property
    def subject(self) -> str:
        return subject_key(self.model_label, self.object_id)


def subject_key(model_label: str, object_id: Any) -> str:
    return f"{model_label.lower()}:{object_id}"[:MAX_SUBJECT]


def declared(actor: dramatiq.Actor[Any, Any]) -> dict[str, str]:
    """The actor's ``refers_to`` option: argument name -> model label (lower case)."""
    raw = actor.options.get(OPTION) or {}
    return {str(name): str(label).lower() for name, label in raw.items()}


@cache
def _parameters(fn: Any) -> tuple[str, ...]:
    # Decorators (rate limits, locks) wrap actors with functools.wraps: the
    # positions are those of the function underneath, which signature() follows
    # (through __wrapped__) unless a wrapper states its own (__signature__: a
    # Django task taking a context hides that parameter from its callers).
    return tuple(inspect.signature(fn).parameters)


@cache
def positional_parameters(fn: Any) -> tuple[str, ...]:
    """The names a call can pass by position, in order (``_parameters``' caveats)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds)


@cache
def keyword_parameters(fn: Any) -> tuple[str, ...]:
    """The names a call can pass by keyword."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds)


def references(
    actor: dramatiq.Actor[Any, Any], args: list[Any] | tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Reference]:
    """The objects a message's arguments name, in the order the actor declares them."""
    wanted = declared(actor)
    if not wanted:
        return []
    values = named_arguments(actor, args, kwargs)
    found = []
    for argument, label in wanted.items():
        value = values.get(argument)
        # Ids only: anything else (a redacted or malformed value) names nothing.
        if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
            continue
        found.append(Reference(argument, label, str(value)))
    return found


def searchable(actor: dramatiq.Actor[Any, Any]) -> tuple[str, ...]:
    """The actor's ``search_by`` option: argument paths (``user_id``, ``order.number``)."""
    raw = actor.options.get(SEARCH_OPTION) or ()
    return (raw,) if isinstance(raw, str) else tuple(str(path) for path in raw)


def argument_text(value: Any) -> str:
    """How a searched value is written: text as it is, anything else as JSON, so
    that the id 7 and the text "7" are one subject (``user_id=7``)."""
    return value if isinstance(value, str) else json.dumps(value)


def is_argument_subject(subject: str) -> bool:
    """Whether a stored subject is a ``search_by`` value (``order.number=A-12``)
    rather than an object (``auth.user:7``)."""
    head, _, _ = subject.partition("=")
    return head != subject and ":" not in head


def argument_subject(path: str, value: Any) -> str:
    # "=" after a dotted path: never an object's "app.model:id"
    return f"{path}={argument_text(value)}"[:MAX_SUBJECT]


def values_at(named: dict[str, Any], path: str) -> list[Any]:
    """The scalar values at ``path`` in a job's arguments by name: none if the path
    is missing, each element if it ends at a list of scalars; secrets left out."""
    first, *rest = path.split(".")
    if first not in named:
        return []
    value = named[first]
    for key in rest:
        if not isinstance(value, dict) or key not in value:
            return []
        value = value[key]
    found = value if isinstance(value, list) else [value]
    keys = path.split(".")
    return [
        v
        for v in found
        if isinstance(v, SCALARS)
        # a secret-looking value, or one under a secret-looking name anywhere on
        # the path (password_reset.code): never an index row, shown and searchable
        and all(redact(v, name=key) == v for key in keys)
        # a value cut to fit would stand for others: left unindexed
        and len(path) + 1 + len(argument_text(v)) <= MAX_SUBJECT
    ]


def named_arguments(
    actor: dramatiq.Actor[Any, Any], args: list[Any] | tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    values = dict(zip(_parameters(actor.fn), args, strict=False))
    values.update(kwargs)
    return values


def subjects_of(
    actor: dramatiq.Actor[Any, Any], args: list[Any] | tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str, ...]:
    """The indexed subjects of a message, once each, in declared order: each object
    it names (``refers_to``), then each searchable argument value (``search_by``)."""
    subjects = [ref.subject for ref in references(actor, args, kwargs)]
    if paths := searchable(actor):
        named = named_arguments(actor, args, kwargs)
        for path in paths:
            subjects.extend(argument_subject(path, v) for v in values_at(named, path))
    return tuple(dict.fromkeys(subjects))


def jobs_naming(queryset: QuerySet[Job], subject: str) -> QuerySet[Job]:
    """The jobs of ``queryset`` whose arguments name ``subject`` (``auth.user:7``).

    A join through jobs_reference_subject_job (subject, job id): one object's
    jobs, newest first, without reading the ledger's other rows.
    """
    return queryset.filter(references__subject=subject)


_discovered = False


def discover() -> None:
    # The web process imports actor modules only when something asks for them.
    global _discovered
    if not _discovered:
        autodiscover_modules(*getattr(settings, "DRAMATIQ_AUTODISCOVER_MODULES", ("tasks",)))
        _discovered = True


def actor_named(name: str) -> dramatiq.Actor[Any, Any] | None:
    broker = dramatiq.get_broker()
    if name not in broker.actors:
        discover()
    actor: dramatiq.Actor[Any, Any] | None = broker.actors.get(name)
    return actor


def referenced_models() -> set[str]:
    """Labels (lower case) of every model some actor's arguments refer to."""
    discover()
    labels: set[str] = set()
    for actor in dramatiq.get_broker().actors.values():
        labels.update(declared(actor).values())
    return labels


def declaration_errors() -> list[str]:
    """Declarations naming an unknown model or an argument the actor does not take."""
    discover()
    errors = []
    for name, actor in sorted(dramatiq.get_broker().actors.items()):
        parameters = _parameters(actor.fn)
        for argument, label in declared(actor).items():
            if argument not in parameters:
                errors.append(f"{name}: refers_to names {argument!r}, not an argument")
            try:
                apps.get_model(label)
            except (LookupError, ValueError):
                errors.append(f"{name}: refers_to {argument!r} -> {label!r}, no such model")
        for path in searchable(actor):
            if path.split(".")[0] not in parameters:
                errors.append(f"{name}: search_by names {path!r}, not an argument")
    return errors
