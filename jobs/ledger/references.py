"""What a job's arguments refer to, as its actor declares it.

An actor names the model each id argument points at::

    @dramatiq.actor(queue_name="emails", refers_to={"user_id": "auth.User"})
    def send_welcome_email(user_id: int) -> None: ...

The platform never imports the product: this declaration is the only way it
learns that ``user_id`` is a user. The ledger stores every declared reference of
a job as a ``JobReference`` row (``"auth.user:7"``, indexed with the job), which
is how the admin finds one object's jobs on a large ledger: each object a job's
page links to, and each model with a "Jobs" link, finds the job.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import dramatiq
from django.apps import apps
from django.conf import settings
from django.db.models import QuerySet
from django.utils.module_loading import autodiscover_modules

if TYPE_CHECKING:
    from jobs.models import Job

OPTION = "refers_to"
MAX_SUBJECT = 200


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


def references(
    actor: dramatiq.Actor[Any, Any], args: list[Any] | tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Reference]:
    """The objects a message's arguments name, in the order the actor declares them."""
    wanted = declared(actor)
    if not wanted:
        return []
    values = dict(zip(_parameters(actor.fn), args, strict=False))
    values.update(kwargs)
    found = []
    for argument, label in wanted.items():
        value = values.get(argument)
        # Ids only: anything else (a redacted or malformed value) names nothing.
        if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
            continue
        found.append(Reference(argument, label, str(value)))
    return found


def subjects_of(
    actor: dramatiq.Actor[Any, Any], args: list[Any] | tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str, ...]:
    """The indexed subjects of a message: each object it names, once, in declared order."""
    return tuple(dict.fromkeys(ref.subject for ref in references(actor, args, kwargs)))


def jobs_naming(queryset: QuerySet[Job], subject: str) -> QuerySet[Job]:
    """The jobs of ``queryset`` whose arguments name ``subject`` (``auth.user:7``).

    A join through jobs_reference_subject_job (subject, job id): one object's
    jobs, newest first, without reading the ledger's other rows.
    """
    return queryset.filter(references__subject=subject)


_discovered = False


def _discover() -> None:
    # The web process imports actor modules only when something asks for them.
    global _discovered
    if not _discovered:
        autodiscover_modules(*getattr(settings, "DRAMATIQ_AUTODISCOVER_MODULES", ("tasks",)))
        _discovered = True


def actor_named(name: str) -> dramatiq.Actor[Any, Any] | None:
    broker = dramatiq.get_broker()
    if name not in broker.actors:
        _discover()
    actor: dramatiq.Actor[Any, Any] | None = broker.actors.get(name)
    return actor


def referenced_models() -> set[str]:
    """Labels (lower case) of every model some actor's arguments refer to."""
    _discover()
    labels: set[str] = set()
    for actor in dramatiq.get_broker().actors.values():
        labels.update(declared(actor).values())
    return labels


def declaration_errors() -> list[str]:
    """Declarations naming an unknown model or an argument the actor does not take."""
    _discover()
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
    return errors
