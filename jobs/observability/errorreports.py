"""Error reports (the 500 email, the debug page) without credentials, and not a flood.

Django's ``SafeExceptionReporterFilter`` hides settings whose *names* look
secret (``SECRET_KEY``, ``DATABASE_PASSWORD``), but a password inside a URL has
an innocent name: ``REDIS_URL``, ``DATABASE_URL``, ``CACHES['default']['LOCATION']``
and the broker's URL went out in clear in every error email. ``SecretsReporterFilter``
also masks whatever looks like a credential in any value (``scheme://user:pw@``,
bearer tokens, ``password=...`` pairs: the ledger's rules, ``redact_text``), in
settings, in ``request.META`` (the dev server copies the environment there) and
in the traceback's local variables.

``ThrottledAdminEmailHandler`` bounds the mail: one email per kind of error
(logger, exception type and the place it was raised) per ``WINDOW_S``, and at most
``PER_HOUR`` emails an hour per process, however many anonymous requests provoke
one. What it holds back is counted in the next email it sends.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from typing import Any

from django.http import HttpRequest
from django.utils.log import AdminEmailHandler
from django.views.debug import ExceptionReporter, SafeExceptionReporterFilter

from jobs.ledger.redaction import redact, redact_text


class SecretsReporterFilter(SafeExceptionReporterFilter):
    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        return _mask(cleansed)

    def get_safe_request_meta(self, request: HttpRequest) -> dict[str, Any]:
        return {key: _mask(value) for key, value in super().get_safe_request_meta(request).items()}

    def get_traceback_frame_variables(self, request: Any, tb_frame: Any) -> Any:
        variables = super().get_traceback_frame_variables(request, tb_frame)
        return [(name, _mask(value)) for name, value in variables]

    def get_safe_cookies(self, request: HttpRequest) -> dict[str, Any]:
        # Every value: a session cookie in an error email is a logged-in session
        # for whoever reads it (Django masks only names that look secret).
        if not hasattr(request, "COOKIES"):  # an error logged outside a request
            return {}
        return {name: self.cleansed_substitute for name in request.COOKIES}


class SecretsExceptionReporter(ExceptionReporter):
    """Django's reporter, with the query string masked where it shows: the GET
    items (by name and by value, as the ledger's rules do) and the request's
    URI. ``DEFAULT_EXCEPTION_REPORTER`` names it."""

    def get_traceback_data(self) -> dict[str, Any]:
        data: dict[str, Any] = super().get_traceback_data()
        if "request_GET_items" in data:
            items = [(key, redact(value, name=key)) for key, value in data["request_GET_items"]]
            data["request_GET_items"] = [(key, _mask(value)) for key, value in items]
        if isinstance(data.get("request_insecure_uri"), str):
            data["request_insecure_uri"] = redact_text(data["request_insecure_uri"])
        return data


def _mask(value: Any, depth: int = 0) -> Any:
    # Strings and plain containers only: repr() of anything else can run code
    # (a QuerySet runs its query again, and raises again in a report about a
    # database error, which lost the email); Django formats those itself.
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, bytes):
        text = value.decode("utf-8", "replace")
        return value if redact_text(text) == text else redact_text(text)
    if depth < 4 and type(value) in (dict, list, tuple):
        if isinstance(value, dict):
            return {key: _mask(item, depth + 1) for key, item in value.items()}
        return type(value)(_mask(item, depth + 1) for item in value)
    return value


WINDOW_S = 600.0
PER_HOUR = 10


class ThrottledAdminEmailHandler(AdminEmailHandler):
    def __init__(
        self, *args: Any, window_s: float = WINDOW_S, per_hour: int = PER_HOUR, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.window_s = window_s
        self.per_hour = per_hour
        self._lock = threading.Lock()
        self._last_by_kind: dict[tuple[str, ...], float] = {}
        self._sent: deque[float] = deque()
        self._held = 0

    def emit(self, record: logging.LogRecord) -> None:
        held = self._admit(record)
        if held is None:
            return
        if held:
            record.msg = f"{record.msg} ({held} error email(s) held back before this one)"
        super().emit(record)

    def send_mail(self, subject: Any, message: Any, *args: Any, **kwargs: Any) -> None:
        # The reporter masks settings, locals and the request; the exception's
        # own text (a URL with its password in a connection error) is masked here.
        if kwargs.get("html_message"):
            kwargs["html_message"] = redact_text(kwargs["html_message"])
        super().send_mail(redact_text(str(subject)), redact_text(str(message)), *args, **kwargs)

    def _admit(self, record: logging.LogRecord) -> int | None:
        """None to hold the record back; else how many were held back before it."""
        now = time.monotonic()
        kind = _kind(record)
        with self._lock:
            while self._sent and now - self._sent[0] > 3600:
                self._sent.popleft()
            last = self._last_by_kind.get(kind)
            if (last is not None and now - last < self.window_s) or len(
                self._sent
            ) >= self.per_hour:
                self._held += 1
                return None
            self._last_by_kind[kind] = now
            self._sent.append(now)
            held, self._held = self._held, 0
            return held


def _kind(record: logging.LogRecord) -> tuple[str, ...]:
    if record.exc_info and record.exc_info[1] is not None:
        error = record.exc_info[1]
        frames = traceback.extract_tb(error.__traceback__)
        place = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        return (record.name, type(error).__qualname__, place)
    return (record.name, str(record.msg))
