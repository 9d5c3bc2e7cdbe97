"""Worker liveness on one clock, Redis's, and no verdict right after an outage.

Dramatiq judges a worker dead when its heartbeat (``<ns>:__heartbeats__``) is
older than ``heartbeat_timeout``, during "maintenance", and hands its running
jobs to others. Two ways that verdict went wrong for a live worker (issue 29,
item 4):

- **Clocks.** Each caller sent its own clock: a beat wrote the beating host's
  time and maintenance compared it with the judging host's. A host whose clock
  ran ``heartbeat_timeout`` ahead saw every other worker dead. Here every
  beat and every judgement reads ``TIME`` inside the script, the one clock all
  hosts share; the caller's timestamp argument is replaced before Dramatiq's
  ``dispatch.lua`` reads it.
- **Outages.** While Redis is down, hung or cut off from everyone, no worker
  can beat. The first maintenance after it saw every other heartbeat stale and
  requeued their running jobs: a second start of each (2 of 7 runs with four
  processes, two 25 s jobs and Redis stopped 5 s). Each dispatch now notes when
  Redis last heard from anyone (``__last_contact__``); a silence longer than
  half the timeout starts a new contact period (``__contact_since__``), and no
  worker is judged until it is a whole timeout old: by then every live worker
  has beaten again. ``holder_alive`` asks the same question, so a live holder's
  ``run_once`` claim is not taken over in that window either.

A worker cut off alone (its host partitioned) is still judged dead after the
timeout: Redis hears from the others, so no new contact period starts.

- **Due times.** A delayed message (a retry's backoff, ``send_with_options(delay=)``)
  carried the sending host's time as its ``eta``, and the worker that holds it
  until then compared it with its own clock: a retry sent by a host an hour
  ahead waited an hour on every other host. ``eta`` is now on Redis's clock
  (``redis_now_ms``), and a worker turns it into its own clock when it fetches
  the message (``to_local_ms``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from redis import Redis

from jobs.broker.scripts import LuaScript

# Redis's clock in milliseconds, as Lua; TIME is allowed in scripts since Redis
# 5 (effects are replicated, not the script).
_NOW = """
local jobs_time = redis.call("TIME")
local jobs_now = tonumber(jobs_time[1]) * 1000 + math.floor(tonumber(jobs_time[2]) / 1000)
"""

# Before dispatch.lua's text. ARGV (dispatch.lua's): command, timestamp,
# queue_name, worker_id, heartbeat_timeout, dead_message_ttl, do_maintenance, ...
DISPATCH_PREFIX = (
    "-- jobs.broker.clock: Redis's clock, and no verdict right after an outage\n"
    + _NOW
    + """
ARGV[2] = tostring(jobs_now)
local jobs_timeout = tonumber(ARGV[5])
local jobs_last = tonumber(redis.call("get", KEYS[1] .. ":__last_contact__") or "0")
if jobs_now - jobs_last >= 50 then
    -- At most 20 writes a second, not one per command (every enqueue, fetch).
    redis.call("set", KEYS[1] .. ":__last_contact__", jobs_now)
    if jobs_now - jobs_last > jobs_timeout / 2 then
        redis.call("set", KEYS[1] .. ":__contact_since__", jobs_now)
    end
end
if ARGV[7] == "1" then
    local jobs_since = tonumber(redis.call("get", KEYS[1] .. ":__contact_since__") or jobs_now)
    if jobs_now - jobs_since < jobs_timeout then
        ARGV[7] = "0"
    end
end
"""
)

# Before a script whose ARGV[1] is the heartbeat's timestamp (jobs.broker.acks).
FIRST_ARG_PREFIX = _NOW + "ARGV[1] = tostring(jobs_now)\n"

# KEYS: namespace. ARGV: broker ids. The heartbeats of live workers, now.
_BEAT = LuaScript(
    _NOW
    + """
for i = 1, #ARGV do
    redis.call("zadd", KEYS[1] .. ":__heartbeats__", jobs_now, ARGV[i])
end
return jobs_now
"""
)

# KEYS: namespace. ARGV: broker id, heartbeat timeout (ms). 1 while the holder
# beat within the timeout, or while the contact period is too young to judge.
# It notes contact as a dispatch does: after an outage it may be the first
# command Redis serves (a job's run_once asking about a claim's holder).
_HOLDER_ALIVE = LuaScript(
    _NOW
    + """
local timeout = tonumber(ARGV[2])
local last_contact = tonumber(redis.call("get", KEYS[1] .. ":__last_contact__") or "0")
if jobs_now - last_contact >= 50 then
    redis.call("set", KEYS[1] .. ":__last_contact__", jobs_now)
    if jobs_now - last_contact > timeout / 2 then
        redis.call("set", KEYS[1] .. ":__contact_since__", jobs_now)
    end
end
local since = tonumber(redis.call("get", KEYS[1] .. ":__contact_since__") or "0")
if jobs_now - since < timeout then
    return 1
end
local last = redis.call("zscore", KEYS[1] .. ":__heartbeats__", ARGV[1])
if last and jobs_now - tonumber(last) < timeout then
    return 1
end
return 0
"""
)


def queue_beat(pipe: Any, namespace: str, broker_ids: list[str]) -> None:
    """Queue in ``pipe`` the heartbeats of ``broker_ids`` at Redis's time. EVAL, the
    text: a pipelined EVALSHA on a Redis that lost its scripts would fail the beat."""
    if broker_ids:
        pipe.eval(_BEAT.source, 1, namespace, *broker_ids)


def holder_alive(client: Redis, namespace: str, broker_id: str, timeout_ms: int) -> bool:
    """Whether maintenance would spare ``broker_id`` now (see the module)."""
    return bool(_HOLDER_ALIVE(client, [namespace], [broker_id, timeout_ms]))


# Seconds between two readings of Redis's clock against this host's: clocks
# drift by milliseconds a day, and a stepped clock is seen within this time.
OFFSET_REFRESH_S = 30.0


class _Offset:
    """Redis's clock minus this host's, in milliseconds, read at most every
    ``OFFSET_REFRESH_S`` (one TIME); the last reading (0 at first) while Redis
    does not answer."""

    def __init__(self) -> None:
        self.value = 0
        self.read_at = float("-inf")
        self.lock = threading.Lock()

    def get(self, client: Redis) -> int:
        if time.monotonic() - self.read_at < OFFSET_REFRESH_S:
            return self.value
        with self.lock:
            # Marked read only once read: another thread must not take the
            # value of before the first reading meanwhile.
            if time.monotonic() - self.read_at >= OFFSET_REFRESH_S:
                try:
                    before = time.time()
                    seconds, micros = client.time()
                    after = time.time()
                    # The reply was taken halfway through the round trip.
                    self.value = round(seconds * 1000 + micros / 1000 - (before + after) * 500)
                except redis.RedisError:
                    pass  # the last reading stands; tried again at the next refresh
                finally:
                    self.read_at = time.monotonic()
        return self.value


_offset = _Offset()


def redis_now_ms(client: Redis) -> int:
    """Now on Redis's clock, from this host's and the last reading of the offset."""
    return round(time.time() * 1000) + _offset.get(client)


def to_local_ms(client: Redis, redis_ms: int) -> int:
    """``redis_ms`` (a time on Redis's clock) on this host's clock."""
    return redis_ms - _offset.get(client)
