"""A project's own broker class, built on the platform's (for the broker check's test)."""

from __future__ import annotations

from jobs.broker.wakeup import WakeupRedisBroker


class CustomBroker(WakeupRedisBroker):
    pass
