"""Redact secret-looking values before job arguments are stored or shown."""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"
_SECRET_NAME = re.compile(
    r"pass(word|wd)?|secret|token|api[-_]?key|private[-_]?key|auth|credential|cookie|session|signature",
    re.IGNORECASE,
)
# Values that look like a credential whatever their name: bearer tokens, JWTs,
# URLs with a password in them.
_SECRET_VALUE = re.compile(
    r"^(bearer\s+\S+|eyJ[\w-]+\.[\w-]+\.[\w-]+|[a-z][\w+.-]*://[^/\s:@]+:[^/\s@]+@.*)$",
    re.IGNORECASE,
)


def redact(value: Any, *, name: str = "") -> Any:
    """Return ``value`` with secret-named keys and secret-looking strings masked."""
    if name and _SECRET_NAME.search(name):
        return REDACTED
    if isinstance(value, dict):
        return {str(key): redact(item, name=str(key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(item) for item in value]
    if isinstance(value, str) and _SECRET_VALUE.match(value.strip()):
        return REDACTED
    return value


# In free text (exception messages, tracebacks): a secret-named key followed by its
# value (``password=x``, ``'token': 'x'``), bearer tokens, JWTs, and the password
# part of URLs with credentials.
_SECRET_ASSIGNMENT = re.compile(
    r"(?P<key>[\w-]*(?:pass(?:word|wd)?|secret|token|api[-_]?key|private[-_]?key|credential|"
    r"cookie|signature)[\w-]*[\"']?\s*[:=]\s*)(?P<value>[\"'][^\"'\n]*[\"']|[^\s,;)}\]]+)",
    re.IGNORECASE,
)
_SECRET_IN_TEXT = re.compile(r"bearer\s+[\w.~+/=-]+|eyJ[\w-]+\.[\w-]+\.[\w-]+", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][\w+.-]*://[^/\s:@]+:)[^/\s@]+@", re.IGNORECASE)


def redact_text(text: str) -> str:
    """Return ``text`` with secret-looking parts masked (for errors and tracebacks)."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}@", text)
    text = _SECRET_IN_TEXT.sub(REDACTED, text)
    return _SECRET_ASSIGNMENT.sub(lambda m: f"{m['key']}{REDACTED}", text)


def contains_redaction(value: Any) -> bool:
    if value == REDACTED:
        return True
    if isinstance(value, dict):
        return any(contains_redaction(item) for item in value.values())
    if isinstance(value, list):
        return any(contains_redaction(item) for item in value)
    return False
