"""An unreachable Redis or database is reported once, then at a bounded rate.

With Redis down, every consumer thread, the heartbeat, the outbox relay and the
ledger log a connection error with its traceback on each attempt: measured,
1,058 lines and 44 tracebacks in 15 s from one worker process of two threads,
and no line named the setting; with PostgreSQL down, 615 lines and 12
tracebacks. ``OutageFilter`` sits on every log handler (``install()``, from the
app's ``ready()``): the first connection error to a ``host:port`` becomes one
line naming the settings that point there (never a password: only the address
is shown), later ones within ``EVERY_S`` are dropped, and then one line a period
says how many were. Records about anything else pass as they are.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from urllib.parse import urlsplit

EVERY_S = 30.0
# (what, pattern of its address in an error's text): redis-py's and psycopg's words.
# redis-py writes "Error 111 connecting to host:port."; a line of the application
# that says "connecting to api.example.com:443" is not about Redis.
_PLACES = (
    ("Redis", re.compile(r"\bError -?\d+ connecting to ([^\s]+?):(\d+)\.?(?:\s|$)")),
    ("Redis", re.compile(r"\bError -?\d+ connecting to unix socket: ([^\s]+?)\.?(?:\s|$)()")),
    (
        "Database",
        re.compile(r'connection to server at "([^"]+)"(?: \([^)]*\))?, port (\d+) failed'),
    ),
    ("Database", re.compile(r'connection to server on socket "([^"]+)"()')),
)
# The server answered (a wrong database name, a refused login): not an outage,
# and its traceback is what a person needs.
_ANSWERED = re.compile(r"\bFATAL:")
_VERDICT = "_jobs_outage_verdict"  # private: the JSON formatter skips "_" names
# Dramatiq's consumer says it reconnects right after saying why: part of the same report.
_FOLLOW_UPS = ("Restarting consumer in",)


def _error_text(record: logging.LogRecord) -> str:
    """The record's message and the texts of its exception chain."""
    texts = [record.getMessage()]
    error = record.exc_info[1] if record.exc_info else None
    while error is not None and len(texts) < 10:
        texts.append(str(error))
        error = error.__cause__ or error.__context__
    return " ".join(texts)


def _where(text: str) -> tuple[str, str] | None:
    """``(what, address)`` of a connection failure the text tells of, or None."""
    for what, pattern in _PLACES:
        found = pattern.search(text)
        if found:
            host, port = found.groups()
            return what, f"{host}:{port}" if port else host
    return None


def _settings_at(what: str, address: str) -> str:
    """The settings that point at ``address``: what a person should look at."""
    try:
        from django.conf import settings

        from jobs.conf import jobs_settings

        if what == "Database":
            return (
                " and ".join(
                    f"DATABASES[{alias!r}]"
                    for alias, db in settings.DATABASES.items()
                    if address in (f"{db.get('HOST')}:{db.get('PORT') or 5432}", db.get("HOST"))
                )
                or "DATABASES"
            )
        named = []
        broker_url = settings.DRAMATIQ_BROKER.get("OPTIONS", {}).get("url", "")
        if _same_place(broker_url, address):
            named.append("DRAMATIQ_BROKER")
        alias = jobs_settings.JOBS_CACHE
        cache_url = str(settings.CACHES.get(alias, {}).get("LOCATION", ""))
        if _same_place(cache_url, address):
            named.append(f"CACHES[{alias!r}]")
    except Exception:  # a log filter must never raise
        return what
    return " and ".join(named) or what


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
        # A record goes through every handler on its way up: judge it once.
        verdict: bool | None = getattr(record, _VERDICT, None)
        if verdict is None:
            verdict = self._judge(record)
            setattr(record, _VERDICT, verdict)
        return verdict

    def _judge(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            text = _error_text(record)
        except Exception:
            # A record that cannot be rendered is logging's to report ("--- Logging
            # error ---"), never an exception in the code that logged it.
            return True
        if message.startswith(_FOLLOW_UPS):
            return not self._in_outage()
        place = _where(text)
        if place is None or _ANSWERED.search(text):
            return True
        now = time.monotonic()
        with self._lock:
            last, dropped = self._reported.get(place[1], (0.0, 0))
            if last and now - last < self.every_s:
                self._reported[place[1]] = (last, dropped + 1)
                return False
            self._reported[place[1]] = (now, 0)
        # Nothing for twice the period: that outage ended, this one is new.
        fresh = not last or (now - last > 2 * self.every_s and not dropped)
        self._rewrite(record, place, text, dropped, fresh=fresh)
        return True

    def _in_outage(self) -> bool:
        now = time.monotonic()
        with self._lock:
            return any(now - last < self.every_s for last, _ in self._reported.values())

    def _rewrite(
        self,
        record: logging.LogRecord,
        place: tuple[str, str],
        text: str,
        dropped: int,
        fresh: bool,
    ) -> None:
        what, address = place
        where = f"{what} at {address} ({_settings_at(what, address)})"
        text = " ".join(text.split())
        if fresh:
            message = f"{where} is unreachable: {text} Retrying"
        else:
            message = (
                f"{where} still unreachable: {text} "
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
