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

    def validate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidPayload(f"arguments do not fit {fn.__name__}{signature}: {exc}") from None
        for name, value in bound.arguments.items():
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
