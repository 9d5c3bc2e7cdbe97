"""System checks of the job platform (``manage.py check``, start-up of every command).

``jobs.E001``: an actor's ``refers_to`` names an argument it does not take or a
model that does not exist (the admin could not link its jobs), or its
``search_by`` a path whose first name is not an argument.

``jobs.W001``: an actor holds a lock without renewal whose TTL is shorter than the
actor's time limit. Such a job can outlive its lock: the lock expires, a second
worker takes it, and both run the critical section at once.
"""

from __future__ import annotations

from typing import Any

import dramatiq
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.utils.module_loading import autodiscover_modules

from jobs.conf import jobs_settings
from jobs.conf.checks import check_broker
from jobs.consistency.locks import lock_declarations
from jobs.ledger.references import declaration_errors


def check_lock_ttls(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if check_broker():
        return []  # actors cannot declare on that broker; jobs.E002/E003 say why
    # Actors exist once their modules are imported; the web process never
    # imports them otherwise.
    autodiscover_modules(*getattr(settings, "DRAMATIQ_AUTODISCOVER_MODULES", ("tasks",)))
    broker = dramatiq.get_broker()
    default_limit_ms = jobs_settings.JOBS_TIME_LIMIT_MS
    warnings: list[CheckMessage] = []
    for actor_name in sorted(broker.get_declared_actors()):
        actor = broker.get_actor(actor_name)
        time_limit_ms = actor.options.get("time_limit", default_limit_ms)
        for declared in lock_declarations(actor.fn):
            if declared.renew or time_limit_ms <= declared.ttl * 1000:
                continue
            warnings.append(
                Warning(
                    f"Actor {actor_name!r} may run {time_limit_ms / 1000:g} s but holds lock "
                    f"{declared.name_template!r} for {declared.ttl:g} s without renewal.",
                    hint="Pass renew=True, raise the lock's ttl above the time limit, "
                    "or lower the actor's time_limit.",
                    obj=actor_name,
                    id="jobs.W001",
                )
            )
    return warnings


def check_references(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if check_broker():
        return []
    return [Error(problem, id="jobs.E001") for problem in declaration_errors()]
