"""Make job data storable in every database the ledger runs on.

The ledger records what a job was given and how it failed, whatever that was.
PostgreSQL's text and jsonb refuse NUL (U+0000, also as ``\\u0000`` inside
JSON), and no UTF-8 column takes a lone surrogate (U+D800-U+DFFF, what JSON's
``\\ud800`` escapes decode to; SQLite refuses those too). Either would make the
database reject the event's whole batch, so both are replaced with U+FFFD, the
replacement character a UTF-8 decoder shows for bad bytes: the rest of the text
stays readable and the place of the bad character stays visible. JSON has no
NaN or Infinity, yet Python's json writes them (so a job can be sent with
them): PostgreSQL's jsonb and SQLite's JSON_VALID check refuse them, so they
are stored as the strings "NaN", "Infinity" and "-Infinity". Strings longer
than their column are cut to fit, which PostgreSQL would refuse as well, and
integers above their column's range are lowered to its top.

A value changed here is no longer what the job was given: ``altered`` tells,
so nothing sends it to a job again as if it were.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from functools import cache
from typing import Any

from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations

REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_NON_FINITE = frozenset({"NaN", "Infinity", "-Infinity"})
# Identities are never cut: a shortened key would name another row.
_KEYS = frozenset({"message_id", "job_id", "retry_of_id"})
# Exact types ``storable`` returns as they are (a subclass takes the long way).
_WITHOUT_TEXT = frozenset({type(None), bool, int, datetime})


def storable(value: Any) -> Any:
    """``value`` (a string, or JSON-like data) without what a database refuses."""
    kind = type(value)
    # The writer thread runs this over every column of every job: most text is
    # ASCII without NUL (no surrogate either, then), which str methods tell at
    # C speed, and most other values are of types that hold no text at all.
    if kind is str and value.isascii() and "\x00" not in value:
        return value
    if kind in _WITHOUT_TEXT:
        return value
    if isinstance(value, str):
        return _UNSTORABLE.sub(REPLACEMENT, value)
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)  # its JSON5 spelling, in a string
    if isinstance(value, dict):
        return {storable(key): storable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(item) for item in value]
    return value


def unstorable(value: Any) -> bool:
    """Whether ``value`` holds something ``storable`` would have to change."""
    if isinstance(value, str):
        return _UNSTORABLE.search(value) is not None
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(unstorable(key) or unstorable(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return any(unstorable(item) for item in value)
    return False


def altered(value: Any) -> bool:
    """Whether stored JSON may differ from what was given: it holds a
    replacement character or a spelled-out NaN or Infinity."""
    if isinstance(value, str):
        return REPLACEMENT in value or value in _NON_FINITE
    if isinstance(value, dict):
        return any(altered(key) or altered(item) for key, item in value.items())
    if isinstance(value, list):
        return any(altered(item) for item in value)
    return False


@cache
def _max_lengths(model: type[models.Model]) -> dict[str, int]:
    return {
        field.attname: field.max_length
        for field in model._meta.concrete_fields
        if field.max_length is not None and field.attname not in _KEYS
    }


@cache
def _max_integers(model: type[models.Model]) -> dict[str, int]:
    # The ranges Django gives each integer column (the same on every database).
    ranges = BaseDatabaseOperations.integer_field_ranges
    return {
        field.attname: ranges[field.get_internal_type()][1]
        for field in model._meta.concrete_fields
        if field.get_internal_type() in ranges
    }


def storable_columns(model: type[models.Model], values: dict[str, Any]) -> dict[str, Any]:
    """Column values of ``model`` made storable: strings cut to their column's
    length, integers above their column's range lowered to its top (a job that
    ran for more than 24.8 days has a ``duration_ms`` an integer column cannot
    hold; PostgreSQL would refuse it, or take it wrapped around)."""
    limits = _max_lengths(model)
    tops = _max_integers(model)
    fitted = {}
    for name, value in values.items():
        value = storable(value)
        if type(value) is int:
            top = tops.get(name)
            if top is not None and value > top:
                value = top
        else:
            limit = limits.get(name)
            if limit is not None and isinstance(value, str) and len(value) > limit:
                value = value[:limit]
        fitted[name] = value
    return fitted
