"""Redact secret-looking values before job arguments are stored or shown.

A job's arguments are redacted by name (keyword or positional parameter:
``reset(7, "hunter2")`` like ``reset(7, password="hunter2")``) and by look; the
text of its errors loses the values so masked too, since an exception may echo
one without its name (``int(password)``: "invalid literal for int() with base
10: 'hunter2'").

``redact_text`` runs on every log line and on every stored error, whatever its
size and whoever chose it (Django logs the path of each 404), so it is linear in
its input: no pattern may try a long run of characters again from each of its
positions. Secret-named pairs are found from their secret word (a plain
alternation) and each run of key characters is read once; the other patterns
only start where a token starts, and possessive quantifiers never give back
what they took.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dramatiq
from dramatiq.errors import ActorNotFound

REDACTED = "[redacted]"
# Shorter secret values are not searched for in error texts: masking every "1"
# would make tracebacks unreadable. The cap keeps one search per text cheap.
MIN_SECRET_LENGTH = 4
MAX_SECRET_VALUES = 32
_SECRET_WORDS = (
    r"pass(?:word|wd)?|secret|token|api[-_]?key|private[-_]?key|auth|credential|cookie|session"
    r"|signature"
)
_SECRET_NAME = re.compile(_SECRET_WORDS, re.IGNORECASE)
# Values that look like a credential whatever their name: bearer tokens, JWTs,
# URLs with a password in them.
_SECRET_VALUE = re.compile(
    r"^(bearer\s++\S++|eyJ[\w-]++\.[\w-]++\.[\w-]++|[a-z][\w+.-]*+://[^/\s:@]*+:[^/\s@]++@.*)$",
    re.IGNORECASE,
)


# In free text (log lines, tracebacks): a secret-named key and its value, as
# ``name=value`` (keyword arguments, query strings) or ``'name': value`` (dict and
# JSON reprs, where the key is quoted, so "tests passed: 3" is left alone). The
# key is the whole run of ``[\w-]`` characters around a secret word.
_KEY_START = re.compile(r"(?<![\w-])[\w-]*+\Z")
_KEY_REST = re.compile(r"[\w-]*+")
_EQUALS = re.compile(r"\s*+=\s*+")
_COLON = re.compile(r"\s*+:\s*+")
_VALUE = re.compile(
    r"""[bru]?'(?:[^'\\]++|\\.)*+'|[bru]?"(?:[^"\\]++|\\.)*+"|[^\s,;&)}\]]++""", re.IGNORECASE
)
_SECRET_IN_TEXT = (
    (re.compile(r"(bearer\s++)[\w.~+/=-]++", re.IGNORECASE), rf"\1{REDACTED}"),
    # A JWT starts a token: tried from inside one, "eyJeyJ..." is quadratic.
    (re.compile(r"(?<![\w-])eyJ[\w-]++\.[\w-]++\.[\w-]++"), REDACTED),
)
# ``scheme://user:password@``, tried only from the start of a run of scheme
# characters; the scheme proper starts at a letter there or after a + . or -.
# The password runs to the last "@" before the path (as urlparse and redis-py
# read it): one written with a raw "@" ("p@ss") is masked whole, not up to its
# first "@". Greedy then one backtrack over the run: linear per "://".
_URL_CREDENTIALS = re.compile(r"(?<![\w+.-])([\w+.-]++://[^/\s:@]*+:)[^/\s]*@")
_SCHEME_START = re.compile(r"(?:^|[+.-])[a-z]", re.IGNORECASE)


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


@functools.lru_cache(maxsize=1024)
def _positional_parameters(fn: Callable[..., Any]) -> tuple[list[str], list[str]]:
    """(positional names, [*args name] or [""]) of ``fn``: read once per function,
    as ``inspect.signature`` costs more than the rest of a job's ledger event."""
    try:
        # signature(), not signature(unwrap()): it honours a wrapper's __signature__
        # (a Django task taking a context hides that parameter from its callers).
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [], [""]
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    rest = [p.name for p in parameters if p.kind == p.VAR_POSITIONAL] or [""]
    return names, rest


def positional_names(actor_name: str, count: int) -> list[str]:
    """The parameter names of an actor's first ``count`` positional arguments ("" if unknown)."""
    try:
        fn = dramatiq.get_broker().get_actor(actor_name).fn
    except ActorNotFound:
        return [""] * count
    try:
        names, rest = _positional_parameters(fn)
    except TypeError:  # an unhashable callable: read it each time
        names, rest = _positional_parameters.__wrapped__(fn)
    return (names + rest * count)[:count]


def redact_arguments(
    actor_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """A message's arguments, redacted: positional ones by their parameter's name."""
    names = positional_names(actor_name, len(args))
    redacted = [redact(arg, name=name) for arg, name in zip(args, names, strict=True)]
    return redacted, redact(dict(kwargs))


def _collect_secrets(value: Any, name: str, secret: bool, found: set[str]) -> None:
    """Add to ``found`` the strings and numbers that ``redact`` masks in ``value``."""
    secret = secret or bool(name and _SECRET_NAME.search(name))
    if isinstance(value, dict):
        for key, item in value.items():
            _collect_secrets(item, str(key), secret, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_secrets(item, "", secret, found)
    elif isinstance(value, (str, int)) and not isinstance(value, bool):
        text = str(value)
        if secret or (isinstance(value, str) and _SECRET_VALUE.match(text.strip())):
            found.update(
                form for form in (text, repr(text)[1:-1]) if len(form) >= MIN_SECRET_LENGTH
            )


def secret_values(actor_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[str]:
    """The values ``redact_arguments`` masks (as given and as ``repr`` escapes them), longest
    first: what ``mask_values`` hides in the text of this message's errors."""
    found: set[str] = set()
    names = positional_names(actor_name, len(args))
    for arg, name in zip(args, names, strict=True):
        _collect_secrets(arg, name, False, found)
    for name, value in kwargs.items():
        _collect_secrets(value, name, False, found)
    return sorted(found, key=lambda value: (-len(value), value))[:MAX_SECRET_VALUES]


def mask_values(text: str, values: Sequence[str]) -> str:
    """``text`` with each of ``values`` (from ``secret_values``) masked."""
    if not values:
        return text
    # One pass, longest value first: masks are never searched again, so values
    # that overlap "[redacted]" cannot make the text grow pass after pass.
    return re.sub("|".join(map(re.escape, values)), REDACTED, text)


def contains_redaction(value: Any) -> bool:
    if value == REDACTED:
        return True
    if isinstance(value, dict):
        return any(contains_redaction(item) for item in value.values())
    if isinstance(value, list):
        return any(contains_redaction(item) for item in value)
    return False


def _masked(value: str) -> str:
    quote = value.lstrip("bruBRU")[:1]
    return f"{quote}{REDACTED}{quote}" if quote in ("'", '"') else REDACTED


def _value_after_key(text: str, key_start: int, key_end: int, done: int) -> re.Match[str] | None:
    """The value of the key ``text[key_start:key_end]``, if a value follows it.

    A quoted key's opening quote must not belong to the pair masked before
    (which ends at ``done``).
    """
    equals = _EQUALS.match(text, key_end)
    if equals:
        return _VALUE.match(text, equals.end())
    quote = text[key_start - 1] if key_start > done else ""
    if quote in ("'", '"') and text.startswith(quote, key_end):
        colon = _COLON.match(text, key_end + 1)
        if colon:
            return _VALUE.match(text, colon.end())
    return None


def _redact_pairs(text: str) -> str:
    parts: list[str] = []
    done = 0  # text[:done] is in parts
    searched = 0  # no secret word before here is left to look at
    while hit := _SECRET_NAME.search(text, searched):
        start_match = _KEY_START.search(text, searched, hit.start())
        key_start = start_match.start() if start_match else hit.start()
        key_end = _KEY_REST.match(text, hit.end()).end()  # type: ignore[union-attr]
        value = _value_after_key(text, key_start, key_end, done)
        if value is None:
            searched = key_end  # the key's other secret words give the same answer
            continue
        parts += [text[done : value.start()], _masked(value.group())]
        done = searched = value.end()
    return "".join(parts) + text[done:] if parts else text


def _mask_url_password(match: re.Match[str]) -> str:
    scheme = match.group(1).partition("://")[0]
    if not _SCHEME_START.search(scheme):
        return match.group()
    return f"{match.group(1)}{REDACTED}@"


def redact_text(text: str) -> str:
    """``text`` with the values of secret-named pairs and secret-looking tokens masked."""
    text = _redact_pairs(text)
    for pattern, replacement in _SECRET_IN_TEXT:
        text = pattern.sub(replacement, text)
    return _URL_CREDENTIALS.sub(_mask_url_password, text)
