"""Scenarios: the consistency toolkit against the raw Redis calls it is built on."""

from __future__ import annotations

import secrets

from django.core.cache import cache
from django_redis import get_redis_connection

from bench.registry import Variants, scenario
from jobs.consistency.cache import cached
from jobs.consistency.locks import redis_lock

_RAW_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


@scenario(
    "lock-cycle",
    "redis_lock acquire+release (renewal on) vs raw SET NX PX + Lua release",
    n=5_000,
    quick_n=1_000,
    target=0.95,
)
def lock_cycle() -> Variants:
    client = get_redis_connection("default")
    release = client.register_script(_RAW_RELEASE)

    def raw(n: int) -> None:
        for _ in range(n):
            token = secrets.token_hex(16)
            if not client.set("bench:raw-lock", token, nx=True, px=60_000):
                raise RuntimeError("raw lock unexpectedly held")
            release(keys=["bench:raw-lock"], args=[token])

    def toolkit(n: int) -> None:
        for _ in range(n):
            with redis_lock("bench:lock", ttl=60, wait=0):
                pass

    return Variants(toolkit, raw, "redis_lock", "SET NX PX + Lua")


@scenario(
    "cache-hit",
    "cached() hit (version, value, hit counter: one round trip) vs cache.get",
    n=10_000,
    quick_n=2_000,
    target=0.95,
)
def cache_hit() -> Variants:
    value = {"id": 1, "username": "ada", "email": "ada@example.com", "first_name": "Ada"}
    cache.set("bench:raw", value, 600)
    cached("bench", "1", lambda: value, ttl=600)

    def raw(n: int) -> None:
        for _ in range(n):
            cache.get("bench:raw")

    def toolkit(n: int) -> None:
        for _ in range(n):
            cached("bench", "1", _unexpected_miss, ttl=600)

    return Variants(toolkit, raw, "cached()", "cache.get")


def _unexpected_miss() -> object:
    raise RuntimeError("cache-hit scenario missed")
