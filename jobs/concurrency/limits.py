"""Concurrency limits changed at run time, from the admin, without a deploy.

An override is kept in Redis (``<ns>:__limit_overrides__``), per key template
(``template:<template>``: every actor declaring it) or per key pattern
(``pattern:<glob>``, such as ``tenant:big*``: one tenant's keys). For a job's
key the longest matching pattern wins, then its template's override, then the
declared limit. Every process reads the overrides at most once a second, so a
change reaches every worker within about a second; a Redis that does not answer
leaves the last read in force.
"""

from __future__ import annotations

import fnmatch
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

OVERRIDES = "__limit_overrides__"
TEMPLATE, PATTERN = "template:", "pattern:"
REFRESH_SECONDS = 1.0
MAX_LIMIT = 100_000


@dataclass
class _Snapshot:
    templates: dict[str, int] = field(default_factory=dict)
    patterns: list[tuple[str, int]] = field(default_factory=list)  # longest first
    read_at: float = float("-inf")


_snapshot = _Snapshot()
_lock = threading.Lock()


def _client() -> tuple[Any, str]:
    from jobs.broker import redis_broker

    broker = redis_broker()
    return broker.client, broker.namespace


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read() -> dict[str, int]:
    """Every override, ``template:…`` and ``pattern:…`` -> limit (one round trip)."""
    client, namespace = _client()
    raw = client.hgetall(f"{namespace}:{OVERRIDES}")
    return {_text(k): int(v) for k, v in raw.items()}


def _current() -> _Snapshot:
    global _snapshot
    snapshot = _snapshot
    if time.monotonic() - snapshot.read_at < REFRESH_SECONDS:
        return snapshot
    with _lock:
        if time.monotonic() - _snapshot.read_at < REFRESH_SECONDS:
            return _snapshot
        try:
            overrides = read()
        except (redis.RedisError, ValueError):  # (a value someone wrote by hand)
            # The last read stays in force; asked again in a second.
            _snapshot = _Snapshot(_snapshot.templates, _snapshot.patterns, time.monotonic())
            return _snapshot
        templates = {k[len(TEMPLATE) :]: v for k, v in overrides.items() if k.startswith(TEMPLATE)}
        patterns = sorted(
            ((k[len(PATTERN) :], v) for k, v in overrides.items() if k.startswith(PATTERN)),
            key=lambda item: -len(item[0]),
        )
        _snapshot = _Snapshot(templates, patterns, time.monotonic())
        return _snapshot


def effective(template: str, key: str, declared: int) -> int:
    """The limit for ``key`` of ``template``: a matching pattern's, the template's
    override, or the declared limit."""
    snapshot = _current()
    if not snapshot.templates and not snapshot.patterns:
        return declared
    for pattern, limit in snapshot.patterns:
        if fnmatch.fnmatchcase(key, pattern):
            return limit
    return snapshot.templates.get(template, declared)


def template_overrides() -> dict[str, int] | None:
    """Template -> overridden limit; None while any key pattern is overridden
    (a pattern's limit depends on each key)."""
    snapshot = _current()
    return None if snapshot.patterns else snapshot.templates


def forget() -> None:
    """Read the overrides again at the next job (after a change in this process)."""
    global _snapshot
    with _lock:
        _snapshot = _Snapshot()


class InvalidLimit(ValueError):
    pass


def parse_limit(text: str) -> int:
    # ASCII digits only: int() also takes "2_0" and other scripts' digits.
    if not re.fullmatch(r"[0-9]{1,7}", text.strip()):
        raise InvalidLimit(f"A limit is a whole number, not {text.strip()[:40]!r}.")
    limit = int(text.strip())
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidLimit(f"A limit is between 1 and {MAX_LIMIT:,}, not {limit}.")
    return limit


def parse_pattern(text: str) -> str:
    pattern = text.strip()
    if not pattern or len(pattern) > 200 or any(c in pattern for c in "\n\r\t"):
        raise InvalidLimit("A key pattern is 1 to 200 characters on one line, such as tenant:big*.")
    return pattern


def set_override(field_name: str, limit: int | None) -> int | None:
    """Set (or, with None, drop) one override; the previous limit, if any (read
    and written in one transaction, so two operators see each other's)."""
    client, namespace = _client()
    key = f"{namespace}:{OVERRIDES}"
    pipe = client.pipeline(transaction=True)
    pipe.hget(key, field_name)
    if limit is None:
        pipe.hdel(key, field_name)
    else:
        pipe.hset(key, field_name, limit)
    before = pipe.execute()[0]
    forget()
    return None if before is None else int(before)


def apply_to_parked() -> int:
    """Give every key with parked jobs its limit under the overrides now in
    Redis, and start the parked jobs that makes room for; the number started."""
    from jobs.concurrency import keys, slots

    forget()
    client, namespace = _client()
    return slots.rehandle(client, namespace, keys.limit_for)


def change(field_name: str, limit: int | None) -> int | None:
    """``set_override`` then ``apply_to_parked``: what code outside the admin
    calls (the admin writes its audit entry in between). The previous limit."""
    before = set_override(field_name, limit)
    apply_to_parked()
    return before
