"""The broker that stands in while ``DRAMATIQ_BROKER`` is missing or malformed.

It lets start-up reach the system checks (jobs.E002 names the setting) instead
of django_dramatiq's RabbitMQ default crashing first, and it refuses to be used:
a process that skips the checks (a WSGI server, ``--skip-checks``) must fail
loudly, not take messages into memory and lose them.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from dramatiq.brokers.stub import StubBroker

REFUSAL = (
    "DRAMATIQ_BROKER is not set (or not a dict): set it with "
    "jobs.conf.dramatiq_broker(url); `python manage.py check` says more."
)


class UnconfiguredBroker(StubBroker):
    def enqueue(self, message: Any, *, delay: int | None = None) -> Any:
        raise ImproperlyConfigured(REFUSAL)

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 100) -> Any:
        raise ImproperlyConfigured(REFUSAL)
