"""Structured log context: request id, job id, actor, attempt, queue.

A request id is set per HTTP request (``RequestIdMiddleware``), copied into the
options of every message enqueued while serving it, and restored in the worker
while that message runs (``JobLogContext``), so a signup's log lines and its
welcome email's log lines share one id. ``ContextFilter`` puts the current
fields on every log record; ``JsonFormatter`` writes one JSON object per line.
"""

from __future__ import annotations

import json
import logging
import re
import traceback
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import dramatiq
from django.http import HttpRequest, HttpResponse
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name

_context: ContextVar[dict[str, Any] | None] = ContextVar("jobs_log_context", default=None)
_VALID_ID = re.compile(r"^[A-Za-z0-9._-]{8,64}$")
FIELDS = ("request_id", "job_id", "actor", "attempt", "queue")


def current() -> dict[str, Any]:
    return dict(_context.get() or {})


def bind(**fields: Any) -> None:
    _context.set({**current(), **fields})


def clear() -> None:
    _context.set(None)


class RequestIdMiddleware:
    """Django middleware: one id per request, from ``X-Request-ID`` if sane."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-ID", "")
        request_id = incoming if _VALID_ID.match(incoming) else uuid.uuid4().hex
        token = _context.set({"request_id": request_id})
        try:
            response = self.get_response(request)
        finally:
            _context.reset(token)
        response["X-Request-ID"] = request_id
        return response


class JobLogContext(dramatiq.Middleware):
    """Carries the request id into messages and sets job fields while one runs."""

    def before_enqueue(self, broker: Broker, message: dramatiq.Message[Any], delay: int) -> None:
        request_id = current().get("request_id")
        if request_id and "request_id" not in message.options:
            message.options["request_id"] = request_id

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        _context.set(
            {
                "request_id": message.options.get("request_id"),
                "job_id": message.message_id,
                "actor": message.actor_name,
                "attempt": int(message.options.get("retries", 0)) + 1,
                "queue": q_name(message.queue_name),
            }
        )

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        clear()

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        clear()


class ContextFilter(logging.Filter):
    """Adds the current context fields to each record (None when unset)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = current()
        for name in FIELDS:
            if not hasattr(record, name):
                setattr(record, name, context.get(name))
        return True


_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, context, extras, stack."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        for key, value in vars(record).items():
            # "_" names are the platform's own bookkeeping (jobs.observability.outages)
            if key not in _STANDARD and not key.startswith("_") and value is not None:
                payload[key] = value
        if record.exc_text:  # already formatted (and redacted) by RedactFilter
            payload["exc_info"] = record.exc_text
        elif record.exc_info:
            payload["exc_info"] = "".join(traceback.format_exception(*record.exc_info))
        if record.stack_info:
            payload["stack_info"] = record.stack_info
        return json.dumps(payload, default=str)


class PlainFormatter(logging.Formatter):
    """Readable lines for development, with the context appended when present."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(
            f"{name}={getattr(record, name)}" for name in FIELDS if getattr(record, name, None)
        )
        return f"{line} [{context}]" if context else line
