"""A delivered message whose fields are read as plain attributes.

Dramatiq hands each delivery to the middleware as a ``MessageProxy``, which
forwards every read of a message field (``message_id``, ``options``, ...)
through ``__getattr__`` to the frozen ``Message`` it wraps: about 44 such reads
per job through the project's middleware, a Python call each, in the worker
threads that share the GIL (issue 17). The consumer copies the fields onto the
proxy once instead; ``Message`` is frozen, so the copies never go stale, and
``options`` is the same dict, so a middleware's change to it is seen through
either.
"""

from __future__ import annotations

import dataclasses

import dramatiq

FIELDS = tuple(field.name for field in dataclasses.fields(dramatiq.Message))


def with_fields(proxy: dramatiq.MessageProxy) -> dramatiq.MessageProxy:
    """``proxy``, its message's fields set on it; returned for chaining."""
    message = proxy._message
    attributes = vars(proxy)
    for name in FIELDS:
        attributes[name] = getattr(message, name)
    return proxy
