"""An actor's concurrency key: a format string over its argument names.

``@dramatiq.actor(concurrency_key="order:{order_id}", concurrency_limit=1)``
lets at most one job per order run at once. The key is checked against the
function's signature when the actor is declared, so a misspelt name fails at
import, not in a worker.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dramatiq
from dramatiq.middleware import MiddlewareError

from jobs.concurrency import limits, slots
from jobs.errors import PermanentJobError

logger = logging.getLogger(__name__)

KEY_OPTION = "concurrency_key"
LIMIT_OPTION = "concurrency_limit"
OPTIONS = frozenset({KEY_OPTION, LIMIT_OPTION})

# Longer keys are shortened to a prefix and a hash: a Redis key per job key,
# and an admin page that lists them.
MAX_KEY_LENGTH = 200


class ConcurrencyKeyError(MiddlewareError, ValueError):
    """An actor's concurrency declaration does not fit its function. A
    MiddlewareError: the broker lets only those out of a declaration hook."""


class ConcurrencyKeyUnusable(PermanentJobError, MiddlewareError):
    """The job's key has data of another type in Redis than this platform
    writes there: no slot can be taken or parked on, so the job fails for good
    before it runs. A MiddlewareError: Dramatiq lets only those out of a
    ``before_process_message`` hook."""


@dataclass(frozen=True)
class KeyTemplate:
    """A key template checked against its actor's signature (``checked_template``)."""

    template: str
    signature: inspect.Signature

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The key of a job with these arguments.

        Arguments that do not fit the function, or a dict without the item the
        key names, give the template itself as the key: such jobs are limited
        together (and the first fails in its call with Python's TypeError),
        never run without a limit."""
        try:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            key = self.template.format_map(bound.arguments)
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as exc:
            if self.template not in _warned:
                _warned.add(self.template)
                logger.warning(
                    "Key %r could not be built (%s: %s); such jobs share the key %r",
                    self.template,
                    type(exc).__name__,
                    exc,
                    self.template,
                )
            return shortened(self.template)
        return shortened(key)


@dataclass(frozen=True)
class Declaration(KeyTemplate):
    limit: int
    queue_name: str = ""


def shortened(key: str) -> str:
    # Redis keys are UTF-8: a lone surrogate (from JSON "\ud800") is spelt out.
    key = key.encode("utf-8", "backslashreplace").decode()
    if len(key) <= MAX_KEY_LENGTH:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{key[: MAX_KEY_LENGTH - 17]}#{digest}"


def declare(actor: dramatiq.Actor[Any, Any]) -> Declaration | None:
    """The actor's declaration, checked; None for an actor without a key."""
    template = actor.options.get(KEY_OPTION)
    limit = actor.options.get(LIMIT_OPTION)
    if template is None:
        if limit is not None:
            raise ConcurrencyKeyError(
                f"Actor {actor.actor_name!r}: concurrency_limit needs a concurrency_key"
            )
        return None
    if not isinstance(template, str) or not template:
        raise ConcurrencyKeyError(
            f"Actor {actor.actor_name!r}: concurrency_key must be a non-empty format string, "
            f'such as "order:{{order_id}}"'
        )
    if limit is None:
        limit = 1
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConcurrencyKeyError(
            f"Actor {actor.actor_name!r}: concurrency_limit must be a whole number of 1 "
            f"or more, not {limit!r}"
        )
    signature = checked_template(actor, KEY_OPTION, template)
    return Declaration(
        template=template, limit=limit, signature=signature, queue_name=actor.queue_name
    )


def checked_template(
    actor: dramatiq.Actor[Any, Any], option: str, template: str
) -> inspect.Signature:
    """The signature of ``actor``'s function, once ``template`` (the value of its
    ``option``) is known to name only its arguments, by name or item."""
    # inspect.signature follows __wrapped__ (cancellation.guarded) and honours
    # __signature__ (a Django task's, without the context workers supply).
    signature = inspect.signature(actor.fn)
    names = set(signature.parameters)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConcurrencyKeyError(
            f"Actor {actor.actor_name!r}: {option} {template!r} is not a format string: {exc}"
        ) from None
    fields = []
    for _, name, spec, _ in parsed:
        if name is None:
            continue
        if spec and "{" in spec:
            raise ConcurrencyKeyError(
                f"Actor {actor.actor_name!r}: {option} {template!r} nests a field in "
                f"a format spec ({spec!r}); write each part of the key as its own field"
            )
        fields.append(name)
    for field in fields:
        root = field.split(".", 1)[0].split("[", 1)[0]
        if "." in field.split("[", 1)[0]:
            raise ConcurrencyKeyError(
                f"Actor {actor.actor_name!r}: {option} {template!r} reads an attribute "
                f"({field!r}); arguments arrive as JSON, so name an item instead: "
                f"{{{root}[...]}}"
            )
        if root not in names:
            raise ConcurrencyKeyError(
                f"Actor {actor.actor_name!r}: {option} {template!r} names {root!r}, "
                f"which is not an argument of {actor.fn.__name__}() "
                f"(its arguments: {', '.join(sorted(names)) or 'none'})"
            )
    return signature


# Templates already warned about (a key that could not be built): once each.
_warned: set[str] = set()

# Actor name -> declaration, filled as actors are declared (the Concurrency
# middleware's after_declare_actor): the consumer looks a message up here.
_declared: dict[str, Declaration] = {}


def register(actor: dramatiq.Actor[Any, Any]) -> None:
    declaration = declare(actor)
    if declaration is None:
        _declared.pop(actor.actor_name, None)
        return
    for name, other in _declared.items():
        # The same template gives the same keys, whose slots are shared: one
        # limit, or each actor would start jobs up to its own.
        same_keys = name != actor.actor_name and other.template == declaration.template
        if same_keys and other.limit != declaration.limit:
            raise ConcurrencyKeyError(
                f"Actor {actor.actor_name!r}: concurrency_key {declaration.template!r} "
                f"is also the key of actor {name!r}, with concurrency_limit={other.limit}; "
                f"actors sharing a key must share its limit"
            )
    _declared[actor.actor_name] = declaration


def key_of(message: dramatiq.Message[Any] | dramatiq.MessageProxy) -> tuple[str, int] | None:
    """(key, limit) of a job whose actor declares a key; None for every other job."""
    declaration = _declared.get(message.actor_name)
    if declaration is None:
        return None
    key = _key(message, declaration)
    return key, limits.effective(declaration.template, key, declaration.limit)


def send_key(message: dramatiq.Message[Any]) -> str | None:
    """The key a sender writes into ``message`` (``slots.SEND_OPTION``), so that
    the fetch takes its slot; None for an actor without a key. Built from the
    arguments as a worker decodes them: ``Tier.GOLD``, a ``(str, Enum)``,
    formats as "Tier.GOLD" here and arrives as "gold", and a retry, an outbox
    send or a delayed job's move is sent from what arrived."""
    declaration = _declared.get(message.actor_name)
    if declaration is None:
        return None
    args, kwargs = tuple(message.args), dict(message.kwargs)
    if not all(type(value) in _PLAIN for value in (*args, *kwargs.values())):
        encoder = dramatiq.get_encoder()
        decoded = encoder.decode(encoder.encode({"args": args, "kwargs": kwargs}))
        args, kwargs = tuple(decoded["args"]), dict(decoded["kwargs"])
    return declaration.key(args, kwargs)


# Argument types that arrive as they were sent (no encoder round trip needed).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def _key(message: dramatiq.Message[Any] | dramatiq.MessageProxy, declaration: Declaration) -> str:
    """The key the sender wrote, or (an older sender) the one its arguments give."""
    key = sent_key(message)
    return key if key is not None else declaration.key(tuple(message.args), dict(message.kwargs))


def sent_key(message: dramatiq.Message[Any] | dramatiq.MessageProxy) -> str | None:
    """The key the sender wrote into the message (``slots.SEND_OPTION``), which
    the fetch took its slot under; None if it wrote none."""
    # A worker whose template differs (a deploy under way) still frees the same
    # slot. (The message itself: an attribute read through a proxy is 0.5 us.)
    key = getattr(message, "_message", message).options.get(slots.SEND_OPTION)
    if not isinstance(key, str) or not key:
        return None
    try:
        key.encode()  # (a lone surrogate: not a key our senders write)
    except UnicodeEncodeError:
        return None
    return key


def fetch_args(queue_name: str, token: Callable[[], int]) -> list[str | int]:
    """What a fetch of ``queue_name`` passes to take its jobs' slots itself
    (``slots.FETCH_PREFIX``): "slots", a take token (``token()``, called only
    for a fetch that takes slots), then each keyed actor of the queue, its
    limit now and its template. Empty (the consumer asks after the fetch) for a
    queue without keyed actors, and while a key pattern's limit is overridden
    (patterns are matched in Python)."""
    queued = [(name, d) for name, d in _declared.items() if d.queue_name == queue_name]
    if not queued:
        return []
    overrides = limits.template_overrides()
    if overrides is None:
        return []
    args: list[str | int] = []
    for name, declaration in queued:
        # The fetch replies with the actor's name in a tab-separated string:
        # an actor named otherwise (Dramatiq does not check names) is left to
        # the consumer's ACQUIRE.
        if name.isascii() and name.isprintable():
            limit = overrides.get(declaration.template, declaration.limit)
            args += [name, limit, declaration.template]
    return ["slots", token(), *args] if args else []


# Attribute of a MessageProxy: the key its slot was taken under and the take's
# token (remember_key).
_TAKE_ATTRIBUTE = "_jobs_concurrency_take"


def remember_key(message: dramatiq.MessageProxy, key: str | None, token: int) -> None:
    """Note on the delivery the key its slot was taken under, and the take's
    token (``jobs.concurrency.takes``): the worker thread that releases it then
    reads the key, not builds it again (7 us a job), and frees that take only."""
    if key is not None:
        setattr(message, _TAKE_ATTRIBUTE, (key, token))


_REFUSED_ATTRIBUTE = "_jobs_concurrency_refused"


def refuse(message: dramatiq.MessageProxy, key: str | None, reason: str) -> None:
    """Note on the delivery that its key cannot be used (``slots.UNUSABLE``)."""
    setattr(message, _REFUSED_ATTRIBUTE, (key, reason))


def check_usable(message: dramatiq.MessageProxy) -> None:
    """Raise ``ConcurrencyKeyUnusable`` for a delivery noted by ``refuse``."""
    # (The proxy's own attributes: a miss through its __getattr__ is 0.5 us.)
    refused = vars(message).get(_REFUSED_ATTRIBUTE)
    if refused is None:
        return
    key, reason = refused
    raise ConcurrencyKeyUnusable(
        f"Its concurrency key {key!r} cannot be used: {reason.rstrip('.')}. Only this "
        "platform writes these keys: delete or repair it, then retry the job."
    )


def held_slot(
    message: dramatiq.Message[Any] | dramatiq.MessageProxy, token: int | None = None
) -> slots.Held | None:
    """The slot ``message``'s delivery holds, to free; None without a key, or
    without a take: none noted on the delivery (``remember_key``) and no
    ``token`` given (the take that may hold one: the fetch's that took it
    while it waited in the prefetch, an ACQUIRE whose reply was lost)."""
    key, token = getattr(message, _TAKE_ATTRIBUTE, (None, token))  # (noted on the proxy)
    if token is None:
        # No take of this delivery: a release "of any take" would free one
        # made later, when this delivery is fetched again (a release held
        # back while Redis is away goes when it answers).
        return None
    # The message itself: each attribute read through a MessageProxy is a
    # Python-level __getattr__, 0.5 us; three of them were most of this call.
    message = getattr(message, "_message", message)
    declaration = _declared.get(message.actor_name)
    if declaration is None:
        return None
    if key is None:
        key = _key(message, declaration)
    limit = limits.effective(declaration.template, key, declaration.limit)
    redis_id = message.options.get("redis_message_id", "")
    return slots.Held(key, message.message_id, limit, redis_id, token)


def limit_of(actor_name: str, key: str) -> int:
    """The limit of ``key`` now for ``actor_name``'s jobs (1 for an actor not
    declared here, the smallest a release may unpark under)."""
    declaration = _declared.get(actor_name)
    if declaration is None:
        return 1
    return limits.effective(declaration.template, key, declaration.limit)


def template_of(actor_name: str) -> str:
    """The key template ``actor_name`` declares ("" for none)."""
    declaration = _declared.get(actor_name)
    return "" if declaration is None else declaration.template


def limit_for(template: str, key: str) -> int | None:
    """The limit of ``key`` now (overrides read afresh), for a key of
    ``template``; None when no actor here declares the template."""
    declaration = next((d for d in _declared.values() if d.template == template), None)
    if declaration is None:
        return None
    return limits.effective(template, key, declaration.limit)


def declared() -> dict[str, Declaration]:
    """Actor name -> its declaration, for the admin's limits page."""
    return dict(_declared)
