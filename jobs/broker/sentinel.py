"""A redis-py client that follows a Sentinel-managed primary across failovers."""

from __future__ import annotations

from typing import Any

import redis
from redis.connection import parse_url
from redis.sentinel import Sentinel

# A Sentinel answers from memory: a slow one is as good as a dead one, and the
# client must move on to the next Sentinel quickly during a failover.
SENTINEL_SOCKET_TIMEOUT_S = 0.5


def master_client(
    sentinels: list[tuple[str, int]], master: str, url: str, **overrides: Any
) -> redis.Redis:
    """A client on ``master``'s current primary, with ``url``'s db, password and options.

    Each new connection asks the Sentinels where the primary is; a connection to
    a dead or demoted primary fails and is dropped, so the next command lands on
    the promoted replica without a restart.
    """
    parsed: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    options = {k: v for k, v in parsed.items() if k not in ("host", "port", "path")}
    options.update(overrides)
    sentinel = Sentinel(
        sentinels,
        sentinel_kwargs={
            "socket_timeout": SENTINEL_SOCKET_TIMEOUT_S,
            "socket_connect_timeout": SENTINEL_SOCKET_TIMEOUT_S,
        },
    )
    client: redis.Redis = sentinel.master_for(master, **options)
    return client
