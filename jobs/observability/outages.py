"""An unreachable Redis is reported once, then at a bounded rate, not per thread per try.

With Redis down, every consumer thread, the heartbeat, the outbox relay and the
ledger log a connection error with its traceback on each attempt: measured,
1,058 lines and 44 tracebacks in 15 s from one worker process of two threads,
and no line named the setting. ``OutageFilter`` sits on every log handler
(``install()``, from the app's ``ready()``): the first connection error to a
``host:port`` becomes one line naming the settings that point there, later ones
within ``EVERY_S`` are dropped, and then one line a period says how many were.
It changes only records about connection errors; everything else passes as it is.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from urllib.parse import urlsplit

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

EVERY_S = 30.0
_ADDRESS = re.compile(r"connecting to ([^\s]+?):(\d+)\.?(?:\s|$)")
_UNIX = re.compile(r"connecting to unix socket: ([^\s.]+(?:\.[^\s.]+)*)\.?")
# Dramatiq's consumer says it reconnects right after saying why: part of the same report.
_FOLLOW_UPS = ("Restarting consumer in",)


def _redis_error(record: logging.LogRecord) -> BaseException | None:
    """The Redis connection error a record is about, through chained exceptions."""
    error = record.exc_info[1] if record.exc_info else None
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, RedisConnectionError | RedisTimeoutError):
            return error
        error = error.__cause__ or error.__context__
        seen += 1
    return None


def _where(text: str) -> str | None:
    found = _ADDRESS.search(text)
    if found:
        return f"{found.group(1)}:{found.group(2)}"
    found = _UNIX.search(text)
    return found.group(1) if found else None


def _settings_at(address: str) -> str:
    """The settings whose Redis is at ``address``: what a person should look at."""
    try:
        from django.conf import settings

        from jobs.conf import jobs_settings

        named = []
        broker_url = settings.DRAMATIQ_BROKER.get("OPTIONS", {}).get("url", "")
        if _same_place(broker_url, address):
            named.append("DRAMATIQ_BROKER")
        alias = jobs_settings.JOBS_CACHE
        cache_url = str(settings.CACHES.get(alias, {}).get("LOCATION", ""))
        if _same_place(cache_url, address):
            named.append(f"CACHES[{alias!r}]")
    except Exception:  # a log filter must never raise
        return "Redis"
    return " and ".join(named) or "Redis"


def _same_place(url: str, address: str) -> bool:
    if not url:
        return False
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path == address
    return f"{parts.hostname}:{parts.port or 6379}" == address


class OutageFilter(logging.Filter):
    def __init__(self, every_s: float = EVERY_S) -> None:
        super().__init__()
        self.every_s = every_s
        self._lock = threading.Lock()
        # address -> (time of the last line written, records dropped since)
        self._reported: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith(_FOLLOW_UPS):
            return not self._in_outage()
        error = _redis_error(record)
        text = str(error) if error is not None else record.getMessage()
        if error is None and "connection error" not in text.lower():
            return True
        address = _where(text)
        if address is None:
            return True
        now = time.monotonic()
        with self._lock:
            last, dropped = self._reported.get(address, (0.0, 0))
            if last and now - last < self.every_s:
                self._reported[address] = (last, dropped + 1)
                return False
            self._reported[address] = (now, 0)
        self._rewrite(record, address, text, dropped, fresh=not last)
        return True

    def _in_outage(self) -> bool:
        now = time.monotonic()
        with self._lock:
            return any(now - last < self.every_s for last, _ in self._reported.values())

    def _rewrite(
        self, record: logging.LogRecord, address: str, text: str, dropped: int, fresh: bool
    ) -> None:
        what = _settings_at(address)
        if fresh:
            message = f"Redis at {address} ({what}) is unreachable: {text} Retrying"
        else:
            message = (
                f"Redis at {address} ({what}) still unreachable: {text} "
                f"({dropped} more such line(s) in {self.every_s:g} s left out)"
            )
        record.msg, record.args = message, ()
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        record.levelno, record.levelname = logging.ERROR, "ERROR"


def install() -> None:
    """Put one ``OutageFilter`` on every handler of every logger configured now."""
    shared = OutageFilter()
    handlers = set(logging.getLogger().handlers)
    for logger in list(logging.Logger.manager.loggerDict.values()):
        handlers.update(getattr(logger, "handlers", []))
    for handler in handlers:
        if not any(isinstance(f, OutageFilter) for f in handler.filters):
            handler.addFilter(shared)
