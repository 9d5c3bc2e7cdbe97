"""Runs the outbox relay thread in every worker process (see ``jobs.consistency.outbox``)."""

from __future__ import annotations

import dramatiq
from django.conf import settings
from dramatiq.broker import Broker


class OutboxRelay(dramatiq.Middleware):
    def __init__(self) -> None:
        self._relay: object | None = None

    def after_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        if settings.JOBS_OUTBOX_RELAY_INTERVAL_MS <= 0:
            return
        from jobs.consistency.outbox import Relay  # models: import after the app registry is ready

        relay = Relay(settings.JOBS_OUTBOX_RELAY_INTERVAL_MS / 1000)
        relay.start()
        self._relay = relay

    def before_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        relay = self._relay
        if relay is not None:
            relay.stop()  # type: ignore[attr-defined]
            self._relay = None
