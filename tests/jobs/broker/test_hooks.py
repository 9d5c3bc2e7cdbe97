"""The broker calls the hooks Dramatiq would, in its order, and no empty ones."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import MiddlewareError


class _Recorder(dramatiq.Middleware):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self.calls.append(f"before {self.name}")

    def after_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self.calls.append(f"after {self.name}")


class _Fails(dramatiq.Middleware):
    def after_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        raise RuntimeError("a broken after hook is logged, never raised")


def _emit_both(emit_before: Any, emit_after: Any, message: Any) -> None:
    emit_before("enqueue", message, None)
    emit_after("enqueue", message, None)


def test_it_calls_the_hooks_dramatiq_calls_in_the_same_order(broker) -> None:
    # Given recorders around middleware without enqueue hooks, one set on the instance
    calls: list[str] = []
    first, last, plain = _Recorder("first", calls), _Recorder("last", calls), dramatiq.Middleware()
    plain.after_enqueue = lambda *args: calls.append("after plain")  # type: ignore[method-assign]
    saved = list(broker.middleware)
    others = [dramatiq.middleware.AgeLimit(), dramatiq.middleware.Retries()]
    broker.middleware[:] = [first, *others, plain, last]
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="q", actor_name="a", args=(), kwargs={}, options={"redis_message_id": "1"}
    )
    try:
        # When the broker and Dramatiq's own Broker emit the same signals
        _emit_both(broker.emit_before, broker.emit_after, message)
        ours = calls[:]
        calls.clear()
        _emit_both(
            lambda *a: dramatiq.Broker.emit_before(broker, *a),
            lambda *a: dramatiq.Broker.emit_after(broker, *a),
            message,
        )
        # Then the calls are the same
        assert ours == calls == ["before first", "before last", "after last", "after plain",
                                 "after first"]  # fmt: skip
        # When a middleware leaves the list, Then it is no longer called
        broker.middleware.remove(last)
        calls.clear()
        _emit_both(broker.emit_before, broker.emit_after, message)
        assert calls == ["before first", "after plain", "after first"]
        # When a middleware is replaced by another that compares equal to it,
        # Then the new one is called, not the one that left
        first_again = _Recorder("first again", calls)
        _Recorder.__eq__ = lambda self, other: isinstance(other, _Recorder)  # type: ignore[method-assign]
        broker.middleware[0] = first_again
        calls.clear()
        _emit_both(broker.emit_before, broker.emit_after, message)
        assert calls == ["before first again", "after plain", "after first again"]
    finally:
        _Recorder.__eq__ = dramatiq.Middleware.__eq__  # type: ignore[method-assign]
        broker.middleware[:] = saved


def test_a_failing_hook_is_logged_and_a_middleware_error_raised(broker, caplog) -> None:
    saved = list(broker.middleware)
    broker.middleware[:] = [_Fails()]
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="q", actor_name="a", args=(), kwargs={}, options={}
    )
    try:
        broker.emit_after("enqueue", message, None)
        assert "Unexpected failure in after_enqueue" in caplog.text

        class _Refuses(dramatiq.Middleware):
            def before_enqueue(self, *args: Any) -> None:
                raise MiddlewareError("refused")

        broker.middleware.append(_Refuses())
        with pytest.raises(MiddlewareError, match="refused"):
            broker.emit_before("enqueue", message, None)
    finally:
        broker.middleware[:] = saved
