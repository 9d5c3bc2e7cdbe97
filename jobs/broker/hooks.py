"""Broker signals sent only to the middleware that handle them.

Dramatiq's ``emit_before``/``emit_after`` call the hook of every middleware for
every signal, and most of them are ``dramatiq.Middleware``'s empty methods: a
send through the project's 16 middleware made 32 calls for the 5 hooks that do
something. ``QuietHooks`` calls the same hooks, in the same order, with the same
error handling, and skips only a middleware whose hook is the base class's own.
"""

from __future__ import annotations

import operator
from typing import Any

import dramatiq
from dramatiq.middleware import MiddlewareError


class QuietHooks:
    """Mixin for a ``dramatiq.Broker``."""

    middleware: list[dramatiq.Middleware]
    logger: Any
    # (the middleware list it was read from, hook name -> middleware defining it)
    _hooks_cache: tuple[list[dramatiq.Middleware], dict[str, list[dramatiq.Middleware]]] = (
        [],
        {},
    )

    def _handlers(self, name: str) -> list[dramatiq.Middleware]:
        seen, hooks = self._hooks_cache
        # Read again whenever the list changed (tests add and remove middleware
        # in place); one tuple, so no thread sees a list with another's hooks.
        # By identity: an equal middleware put in place of another is another.
        current = self.middleware
        if len(seen) != len(current) or not all(map(operator.is_, seen, current)):
            seen, hooks = list(current), {}
            self._hooks_cache = (seen, hooks)
        handlers = hooks.get(name)
        if handlers is None:
            # Not a hook of the base class (check_encoded): whoever defines it.
            empty = getattr(dramatiq.Middleware, name, None)
            handlers = hooks[name] = [
                m
                for m in seen
                if name in getattr(m, "__dict__", ()) or getattr(type(m), name, empty) is not empty
            ]
        return handlers

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        name = "before_" + signal
        if not hasattr(dramatiq.Middleware, name):  # no base hook to tell apart
            super().emit_before(signal, *args, **kwargs)  # type: ignore[misc]
            return
        for middleware in self._handlers(name):
            try:
                getattr(middleware, name)(self, *args, **kwargs)
            except MiddlewareError:
                raise
            except Exception:
                self.logger.critical(
                    "Unexpected failure in %s of %r.", name, middleware, exc_info=True
                )

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        name = "after_" + signal
        if not hasattr(dramatiq.Middleware, name):
            super().emit_after(signal, *args, **kwargs)  # type: ignore[misc]
            return
        for middleware in reversed(self._handlers(name)):
            try:
                getattr(middleware, name)(self, *args, **kwargs)
            except Exception:
                self.logger.critical(
                    "Unexpected failure in %s of %r.", name, middleware, exc_info=True
                )
