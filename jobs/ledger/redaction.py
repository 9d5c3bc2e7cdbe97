"""Redact secret-looking values before job arguments are stored or shown."""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"
_SECRET_WORDS = (
    r"pass(?:word|wd)?|secret|token|api[-_]?key|private[-_]?key|auth|credential|cookie|session"
    r"|signature"
)
_SECRET_NAME = re.compile(_SECRET_WORDS, re.IGNORECASE)
# Values that look like a credential whatever their name: bearer tokens, JWTs,
# URLs with a password in them.
_SECRET_VALUE = re.compile(
    r"^(bearer\s+\S+|eyJ[\w-]+\.[\w-]+\.[\w-]+|[a-z][\w+.-]*://[^/\s:@]+:[^/\s@]+@.*)$",
    re.IGNORECASE,
)


# In free text (log lines, tracebacks): a secret-named key and its value, as
# ``name=value`` (keyword arguments, query strings) or ``'name': value`` (dict and
# JSON reprs, where the key is quoted, so "tests passed: 3" is left alone).
_KEY = rf"[\w-]*(?:{_SECRET_WORDS})[\w-]*"
_VALUE = r"""[bru]?'(?:[^'\\]|\\.)*'|[bru]?"(?:[^"\\]|\\.)*"|[^\s,;&)}\]]+"""
_SECRET_PAIR = re.compile(
    rf"""(?P<key>\b{_KEY}\s*=\s*|(?P<q>['"]){_KEY}(?P=q)\s*:\s*)(?P<value>{_VALUE})""",
    re.IGNORECASE,
)
_SECRET_IN_TEXT = (
    (re.compile(r"(bearer\s+)[\w.~+/=-]+", re.IGNORECASE), rf"\1{REDACTED}"),
    (re.compile(r"eyJ[\w-]+\.[\w-]+\.[\w-]+"), REDACTED),
    # \b: a scheme starts a word; without it every position of a long word is
    # tried as a scheme start, quadratic in its length (seconds for a 64 KiB arg).
    (re.compile(r"\b([a-z][\w+.-]*://[^/\s:@]*:)[^/\s@]+@", re.IGNORECASE), rf"\1{REDACTED}@"),
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


def contains_redaction(value: Any) -> bool:
    if value == REDACTED:
        return True
    if isinstance(value, dict):
        return any(contains_redaction(item) for item in value.values())
    if isinstance(value, list):
        return any(contains_redaction(item) for item in value)
    return False


def _mask_pair(match: re.Match[str]) -> str:
    value = match.group("value")
    quote = value.lstrip("bruBRU")[:1]
    masked = f"{quote}{REDACTED}{quote}" if quote in ("'", '"') else REDACTED
    return match.group("key") + masked


def redact_text(text: str) -> str:
    """``text`` with the values of secret-named pairs and secret-looking tokens masked."""
    text = _SECRET_PAIR.sub(_mask_pair, text)
    for pattern, replacement in _SECRET_IN_TEXT:
        text = pattern.sub(replacement, text)
    return text
