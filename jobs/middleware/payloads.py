"""Every message is checked against its actor's signature before it runs.

The schema of an actor is its signature: the arguments must bind to the
function's parameters and each annotated one must validate (pydantic, strict)
against its type hint. A message that does not fit is a ``PermanentJobError``:
recorded as failed in the ledger, never retried. Messages larger than
``JOBS_MAX_PAYLOAD_BYTES`` are refused when sent, so a huge payload never
reaches Redis.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import MiddlewareError
from pydantic import TypeAdapter, ValidationError

from jobs.broker.limits import PayloadTooLarge, check_encoded, check_size
from jobs.errors import PermanentJobError

__all__ = ["InvalidPayload", "PayloadTooLarge", "Payloads", "check_size"]

Validator = Callable[[tuple[Any, ...], dict[str, Any]], None]


# Dramatiq swallows (logs) exceptions from middleware hooks unless they are
# MiddlewareErrors; these must stop the message, so they are both.


class InvalidPayload(PermanentJobError, MiddlewareError):
    """The message's arguments do not match the actor's signature."""


def fast_binder(
    signature: inspect.Signature,
) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any] | None]:
    """``Signature.bind``'s arguments, for arguments that fit, the short way.

    ``bind`` is pure Python and walks every parameter: on a no-op job it was
    most of this middleware's cost (issue 17). For a signature of plain
    parameters (positional-or-keyword, keyword-only; no ``*args``, ``**kwargs``
    or positional-only ones) this returns what ``bind(...).arguments`` holds,
    in the same order, or None where the arguments do not fit, so the caller
    asks ``bind`` for its error; any other signature always gets None.
    tests/jobs/middleware/test_payloads_binding.py checks it against ``bind``.
    """
    parameters = list(signature.parameters.values())
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind not in plain for p in parameters):
        return lambda args, kwargs: None
    names = [p.name for p in parameters]
    positional = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    required = frozenset(p.name for p in parameters if p.default is inspect.Parameter.empty)
    known = frozenset(names)

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        if not args and not kwargs:
            return None if required else {}
        if len(args) > len(positional):
            return None
        given = dict(zip(positional, args, strict=False))
        for name, value in kwargs.items():
            if name in given or name not in known:
                return None
            given[name] = value
        if not required <= given.keys():
            return None
        if not kwargs:
            return given  # already in parameter order
        return {name: given[name] for name in names if name in given}

    return bind


def build_validator(fn: Callable[..., Any]) -> Validator:
    # Decorators (rate limits, locks) wrap actors with functools.wraps: validate
    # against the function underneath, resolving its hints in its own module.
    # A wrapper may also declare the signature callers see with ``__signature__``
    # (a Django task taking ``context`` hides that first parameter).
    signature = inspect.signature(fn)
    fn = inspect.unwrap(fn)
    hints = typing.get_type_hints(fn)
    adapters = {
        name: TypeAdapter(hints[name])
        for name in signature.parameters
        if name in hints and name != "return"
    }

    bind = fast_binder(signature)

    def validate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        arguments = bind(args, kwargs)
        if arguments is None:  # does not fit, or a signature the short way leaves
            try:
                arguments = signature.bind(*args, **kwargs).arguments
            except TypeError as exc:
                raise InvalidPayload(
                    f"arguments do not fit {fn.__name__}{signature}: {exc}"
                ) from None
        for name, value in arguments.items():
            adapter = adapters.get(name)
            if adapter is None:
                continue
            try:
                adapter.validate_python(value, strict=True)
            except ValidationError as exc:
                problem = exc.errors()[0]["msg"]
                raise InvalidPayload(f"{fn.__name__}: {name}={value!r}: {problem}") from None

    return validate


class Payloads(dramatiq.Middleware):
    def __init__(self) -> None:
        self._validators: dict[str, Validator] = {}

    def before_enqueue(self, broker: Broker, message: dramatiq.Message[Any], delay: int) -> None:
        # A broker that hands us the bytes it sends (check_encoded) saves
        # encoding every message twice; any other broker is checked here.
        if not getattr(broker, "calls_check_encoded", False):
            check_size(message)

    def check_encoded(self, broker: Broker, message: dramatiq.Message[Any], data: bytes) -> None:
        check_encoded(message, data)

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        validator = self._validators.get(message.actor_name)
        if validator is None:
            validator = build_validator(broker.get_actor(message.actor_name).fn)
            self._validators[message.actor_name] = validator
        validator(tuple(message.args), dict(message.kwargs))
