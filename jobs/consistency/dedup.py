"""Deduplicated enqueue: at most one job per key waiting or running.

    send_unique(warm_cache_key, f"cache-warm:{ns}:{key}", ns, key)   # None if one is pending

The key is claimed with ``SET NX PX`` in the broker's Redis before the message
is enqueued and carries the message id; ``jobs.middleware.dedup.Dedup`` deletes
it when that message finishes for good (success, permanent failure, retries
exhausted, skipped), not between retries; cancelling the job from the admin
deletes it at once. The TTL (``JOBS_DEDUP_TTL_MS``, 1 h) frees a
key whose worker died and whose message was never redelivered.
"""

from __future__ import annotations

import logging
from typing import Any

import dramatiq

from jobs.broker import redis_broker
from jobs.broker.scripts import LuaScript
from jobs.conf import jobs_settings

logger = logging.getLogger(__name__)

OPTION = "dedup_key"

# KEYS: dedup key. ARGV: message id. Deletes the key only if this message holds it.
_CLEAR = LuaScript("""
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
""")


def redis_key(key: str) -> str:
    return f"{redis_broker().namespace}:dedup:{key}"


def send_unique(
    actor: dramatiq.Actor[Any, Any], key: str, *args: Any, **kwargs: Any
) -> dramatiq.Message[Any] | None:
    """Enqueue ``actor(*args, **kwargs)`` unless a job with ``key`` is waiting or running."""
    message = actor.message_with_options(args=args, kwargs=kwargs, **{OPTION: key})
    client = redis_broker().client
    ttl_ms = int(jobs_settings.JOBS_DEDUP_TTL_MS)
    if not client.set(redis_key(key), message.message_id, nx=True, px=ttl_ms):
        logger.debug("Job %s already pending; not enqueued", key)
        return None
    try:
        return actor.broker.enqueue(message)
    except BaseException:
        clear(key, message.message_id)
        raise


def clear(key: str, message_id: str) -> bool:
    """Free ``key`` if ``message_id`` holds it; True if it did."""
    return bool(_CLEAR(redis_broker().client, [redis_key(key)], [message_id]))
