"""No secret-looking job argument reaches a log line.

The ledger redacts arguments, but Dramatiq's worker logs the messages it handles
with their arguments (``Failed to process message reset(user_id=7,
password='...')``), and an exception may echo its input. ``RedactFilter`` sits on
every handler of the ``LOGGING`` config (a filter on a logger would miss the
records of its children, such as ``dramatiq.worker.WorkerThread``). It applies
the ledger's rules (``jobs.ledger.redaction``): Dramatiq messages among the
arguments are rendered with their arguments redacted; then the final text of
the message, the traceback and the stack lose the secret values of the messages
the line is about (those among its arguments and the one the thread is running,
so an exception that echoes a password unnamed is covered) and go through
``redact_text``, and extra fields with secret-looking names are masked. Both
formatters (plain and JSON) print what it leaves.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import CurrentMessage

from jobs.ledger.redaction import (
    mask_values,
    redact,
    redact_arguments,
    redact_text,
    secret_values,
)

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_FORMATTER = logging.Formatter()
_ACTOR_CALL = "Received args=%r kwargs=%r."
# An indented line after this one in a traceback is source code, left as it is
# written. After a frame without source (generated code, .pyc-only deploys) the
# next line is the exception's own, not indented, and redacted like any other.
_FRAME = re.compile(r'^\s*File ".*", line \d+')
_SOURCE_INDENT = "    "


class _Rendered:
    """A message shown as Dramatiq shows it (``actor(args, name=value)``), redacted."""

    def __init__(self, message: dramatiq.Message[Any] | MessageProxy) -> None:
        args, kwargs = redact_arguments(message.actor_name, message.args, message.kwargs)
        params = [repr(arg) for arg in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        self.text = f"{message.actor_name}({', '.join(params)})"

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


def _redact_call(record: logging.LogRecord) -> bool:
    """Dramatiq's actor logs ``Received args=[...] kwargs={...}`` on its own logger
    (``<module>.<actor name>``): name the positional arguments by the actor's
    parameters. True if the record was that line."""
    args = record.args
    if record.msg != _ACTOR_CALL or not isinstance(args, tuple) or len(args) != 2:
        return False
    positional, keywords = args
    if not isinstance(positional, (list, tuple)) or not isinstance(keywords, Mapping):
        return False
    record.args = redact_arguments(record.name.rpartition(".")[2], positional, keywords)
    return True


def _secrets_of(record: logging.LogRecord) -> list[str]:
    """The secret argument values of the messages ``record`` is about."""
    args = record.args.values() if isinstance(record.args, Mapping) else record.args or ()
    messages = [arg for arg in args if isinstance(arg, (dramatiq.Message, MessageProxy))]
    current = CurrentMessage.get_current_message()
    if current is not None and all(m.message_id != current.message_id for m in messages):
        messages.append(current)
    found: set[str] = set()
    for message in messages:
        found.update(secret_values(message.actor_name, message.args, message.kwargs))
    return sorted(found, key=lambda value: (-len(value), value))


def _redact_arg(arg: Any) -> Any:
    if isinstance(arg, (dramatiq.Message, MessageProxy)):
        return _Rendered(arg)
    if isinstance(arg, (Mapping, list, tuple)):
        return redact(dict(arg) if isinstance(arg, Mapping) else arg)
    return arg


def _redact_traceback(text: str, secrets: list[str]) -> str:
    lines = mask_values(text, secrets).split("\n")
    return "\n".join(
        line if index and _is_source(line, lines[index - 1]) else redact_text(line)
        for index, line in enumerate(lines)
    )


def _is_source(line: str, previous: str) -> bool:
    return line.startswith(_SOURCE_INDENT) and bool(_FRAME.match(previous))


class RedactFilter(logging.Filter):
    """Masks secrets in a record's arguments, text, traceback and extra fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = _secrets_of(record)
        if not _redact_call(record):
            if isinstance(record.args, Mapping):
                record.args = {key: _redact_arg(value) for key, value in record.args.items()}
            elif record.args:
                record.args = tuple(_redact_arg(arg) for arg in record.args)
        try:
            message = record.getMessage()
        except Exception:
            return True  # a broken format string: the handler reports it (args redacted above)
        # Frozen as text, so every handler and formatter prints the redacted line.
        record.msg, record.args = redact_text(mask_values(message, secrets)), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = _redact_traceback(record.exc_text, secrets)
        if record.stack_info:
            record.stack_info = _redact_traceback(record.stack_info, secrets)
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and isinstance(value, (str, Mapping, list, tuple)):
                if isinstance(value, str):
                    value = mask_values(value, secrets)
                setattr(record, key, redact(value, name=key))
        return True
