"""Access to the configured Redis broker (and its client) with a checked type."""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker


def redis_broker() -> RedisBroker:
    broker = dramatiq.get_broker()
    if not isinstance(broker, RedisBroker):
        raise TypeError(f"expected the RedisBroker, found {type(broker).__name__}")
    return broker
