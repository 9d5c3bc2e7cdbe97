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
"""

from __future__ import annotations

from typing import Any

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
