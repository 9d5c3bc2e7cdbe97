"""Typed readers for environment variables.

Each reader returns the default when the variable is unset or empty, and raises
``ImproperlyConfigured`` naming the variable when its value is malformed, so a
typo fails at start-up instead of surfacing as odd behaviour later.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_str(name: str, default: str) -> str:
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false, yes/no), got {value!r}")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {number}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


@dataclass(frozen=True)
class Rate:
    """A request budget: ``requests`` per ``seconds``."""

    requests: int
    seconds: int


_RATE_RE = re.compile(r"^(\d+)\s*/\s*(\d*)\s*([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(name: str, value: str) -> Rate | None:
    """Parse ``10/m``, ``100/h`` or ``5/30s``; ``off`` means no limit (None)."""
    if value.strip().lower() == "off":
        return None
    match = _RATE_RE.match(value.strip().lower())
    if match is None or int(match.group(1)) <= 0:
        raise ImproperlyConfigured(
            f"{name} must look like '10/m', '100/h', '5/30s' or 'off', got {value!r}"
        )
    count, multiplier, unit = match.groups()
    seconds = int(multiplier or 1) * _UNIT_SECONDS[unit]
    return Rate(requests=int(count), seconds=seconds)


def env_rate(name: str, default: str) -> Rate | None:
    return parse_rate(name, env_str(name, default))
