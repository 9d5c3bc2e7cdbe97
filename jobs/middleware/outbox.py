"""Runs the outbox relay thread in every worker process (see ``jobs.consistency.outbox``)."""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.broker import Broker

from jobs.conf import jobs_settings


class OutboxRelay(dramatiq.Middleware):
    def __init__(self) -> None:
        # One relay per worker: a process that runs two workers on the broker
        # (tests do) stops each one's relay, never leaving one running unowned.
        self._relays: dict[dramatiq.Worker, Any] = {}

    def after_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        if jobs_settings.JOBS_OUTBOX_RELAY_INTERVAL_MS <= 0:
            return
        from jobs.consistency.outbox import Relay  # models: import after the app registry is ready

        relay = Relay(jobs_settings.JOBS_OUTBOX_RELAY_INTERVAL_MS / 1000)
        relay.start()
        self._relays[worker] = relay

    def before_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        relay = self._relays.pop(worker, None)
        if relay is not None:
            relay.stop()
