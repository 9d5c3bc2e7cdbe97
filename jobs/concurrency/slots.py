"""The Redis side of per-key concurrency: slots, parked jobs, and their hand-over.

Per key, in the broker's namespace:

- ``__slots__.<key>``: a hash, message id -> holder: ``W:<broker id>:<redis
  message id>`` for a job a worker took (one delivery of it), ``R:<ms>`` for a
  parked job a freed slot was handed to and that no worker has fetched yet.
- ``__parked__.<key>``: a list of parked jobs, oldest first, each
  ``queue\\nredis message id\\nmessage id\\nparked at (ms)``. The payload stays in the queue's
  ``.msgs`` hash, as for any queued message.
- ``__parked_keys__``: the keys with parked jobs; ``__slot_limits__``: each such
  key's limit, for the sweep (and ``__slot_templates__`` its template, for a
  limit changed at run time); ``__slot_keys__``: the keys with slots taken;
  ``__parked_per_queue__``: parked jobs per queue, which count as waiting
  wherever waiting jobs are counted (``jobs.broker.queues``); ``__parked_ids__``:
  message id -> key of each parked job, for the admin ("waiting for order:42");
  ``__parked_since__.<queue>``: its parked jobs by when they were parked, for the
  age of the queue's oldest waiting job.

A consumer takes a slot before it hands a job on (``acquire``). When the key is
full the same script moves the job from the worker's ack set onto the key's
parked list: no worker thread holds it, no attempt is spent, and a worker
killed afterwards has nothing of it to redeliver. A job that ends frees its slot
(``release``) and the script hands it at once to the oldest parked job: it is
put at the head of its queue, with a wake-up token, and its slot is reserved.
A slot whose holder died is freed by the same verdict that redelivers the
holder's jobs (``jobs.broker.clock``: Redis's clock, no verdict in a young
contact period), never while the holder's heartbeat goes on, however slow its job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs.broker.scripts import LuaScript

SLOTS = "__slots__."
PARKED = "__parked__."
PARKED_KEYS = "__parked_keys__"
SLOT_KEYS = "__slot_keys__"
PER_QUEUE = "__parked_per_queue__"
PARKED_IDS = "__parked_ids__"
PARKED_SINCE = "__parked_since__."
LIMITS = "__slot_limits__"

_NOW = """
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# Frees the slots of dead holders and of reservations never claimed. A holder
# is dead as maintenance judges it (jobs.broker.clock): no heartbeat within the
# timeout, and a contact period at least that old.
_PRUNE = """
local function prune(ns, slots, timeout, now)
    local since = tonumber(redis.call("get", ns .. ":__contact_since__") or "0")
    local judge = now - since >= timeout
    local entries = redis.call("hgetall", slots)
    for i = 1, #entries, 2 do
        local kind, value = string.sub(entries[i + 1], 1, 1), string.sub(entries[i + 1], 3)
        if kind == "R" then
            if now - tonumber(string.match(value, "^%d+")) >= timeout then
                redis.call("hdel", slots, entries[i])
            end
        elseif judge then
            local broker_id = string.match(value, "^[^:]*")
            local last = redis.call("zscore", ns .. ":__heartbeats__", broker_id)
            if not last or now - tonumber(last) >= timeout then
                redis.call("hdel", slots, entries[i])
            end
        end
    end
    if redis.call("hlen", slots) == 0 then
        redis.call("srem", ns .. ":__slot_keys__", string.sub(slots, #ns + 12))
    end
end
"""

# Hands free slots to parked jobs, oldest first: each goes to the head of its
# queue with a reserved slot and a wake-up token (jobs.broker.wakeup).
_UNPARK = """
local function unpark(ns, key, limit, now)
    local slots = ns .. ":__slots__." .. key
    local parked = ns .. ":__parked__." .. key
    local started = 0
    while redis.call("hlen", slots) < limit do
        local entry = redis.call("lpop", parked)
        if not entry then
            break
        end
        local queue, redis_id, message_id, parked_at = string.match(
            entry, "^([^\\n]*)\\n([^\\n]*)\\n([^\\n]*)\\n(%d+)$"
        )
        if not queue then  -- parked before entries carried their time
            queue, redis_id, message_id = string.match(entry, "^([^\\n]*)\\n([^\\n]*)\\n(.*)$")
            parked_at = now
        end
        if message_id then
            redis.call("hdel", ns .. ":__parked_ids__", message_id)
        end
        if queue then
            redis.call("zrem", ns .. ":__parked_since__." .. queue, message_id)
        end
        if queue and redis.call("hincrby", ns .. ":__parked_per_queue__", queue, -1) <= 0 then
            redis.call("hdel", ns .. ":__parked_per_queue__", queue)
        end
        if queue and redis.call("hexists", ns .. ":" .. queue .. ".msgs", redis_id) == 1 then
            redis.call("hset", slots, message_id, "R:" .. now .. ":" .. parked_at)
            redis.call("sadd", ns .. ":__slot_keys__", key)
            redis.call("lpush", ns .. ":" .. queue, redis_id)
            local wake = ns .. ":" .. queue .. ".wake"
            if redis.call("llen", wake) < 64 then
                redis.call("lpush", wake, 1)
            end
            started = started + 1
        end
    end
    if redis.call("llen", parked) == 0 then
        redis.call("srem", ns .. ":__parked_keys__", key)
        redis.call("hdel", ns .. ":__slot_limits__", key)
        redis.call("hdel", ns .. ":__slot_templates__", key)
    end
    return started
end
"""

# KEYS: namespace. ARGV: broker id, queue, heartbeat timeout (ms), then per job
# its key, limit, message id and redis message id. Per job: 1, the slot is the
# job's; 0, parked; 2, the job is no longer in this worker's ack set
# (maintenance handed it back: this worker was judged dead), so it is neither
# run nor parked here. One call per fetch: a round trip per job from the
# consumer thread, which every job goes through, cost 60% of the throughput.
ACQUIRE = LuaScript(
    _NOW
    + _PRUNE
    + """
local ns, broker_id, queue, timeout = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local acks = ns .. ":__acks__." .. broker_id .. "." .. queue
local outcomes = {}
for i = 4, #ARGV, 5 do
    local key, limit = ARGV[i], tonumber(ARGV[i + 1])
    local message_id, redis_id = ARGV[i + 2], ARGV[i + 3]
    local slots = ns .. ":__slots__." .. key
    -- Per delivery, not per message: a second copy of the same message (sent
    -- again, or a retry whose first attempt's release is still pending) is
    -- another job for the limit; only this delivery asking again is not.
    local holder = "W:" .. broker_id .. ":" .. redis_id
    local mine = redis.call("hget", slots, message_id)
    local outcome
    local waited = -1
    if mine and (string.sub(mine, 1, 1) == "R" or mine == holder) then
        outcome = 1
        if string.sub(mine, 1, 1) == "R" then
            waited = now - tonumber(string.match(mine, "(%d+)$"))
        end
    else
        if redis.call("hlen", slots) >= limit then
            prune(ns, slots, timeout, now)
        end
        if redis.call("hexists", slots, message_id) == 0 and redis.call("hlen", slots) < limit then
            outcome = 1
        elseif redis.call("srem", acks, redis_id) == 0 then
            outcome = 2
        else
            local entry = queue .. "\\n" .. redis_id .. "\\n" .. message_id .. "\\n" .. now
            redis.call("rpush", ns .. ":__parked__." .. key, entry)
            redis.call("hincrby", ns .. ":__parked_per_queue__", queue, 1)
            redis.call("hset", ns .. ":__parked_ids__", message_id, key)
            redis.call("zadd", ns .. ":__parked_since__." .. queue, now, message_id)
            redis.call("sadd", ns .. ":__parked_keys__", key)
            redis.call("hset", ns .. ":__slot_limits__", key, limit)
            redis.call("hset", ns .. ":__slot_templates__", key, ARGV[i + 4])
            outcome = 0
        end
    end
    if outcome == 1 then
        redis.call("hset", slots, message_id, holder)
        redis.call("sadd", ns .. ":__slot_keys__", key)
    end
    outcomes[#outcomes + 1] = outcome
    outcomes[#outcomes + 1] = waited
end
return outcomes
"""
)

# KEYS: namespace. ARGV: broker id, then per job its key, message id, limit and
# redis message id. Frees each job's slot (held by this delivery, or reserved
# for the message; not a slot another copy of the same message holds) and
# hands what is free to parked jobs; returns how many it started.
RELEASE = LuaScript(
    _NOW
    + _UNPARK
    + """
local started = 0
for i = 2, #ARGV, 4 do
    local slots = KEYS[1] .. ":__slots__." .. ARGV[i]
    local holder = "W:" .. ARGV[1] .. ":" .. ARGV[i + 3]
    local held = redis.call("hget", slots, ARGV[i + 1])
    if held and (held == holder or string.sub(held, 1, 1) == "R") then
        redis.call("hdel", slots, ARGV[i + 1])
    end
    -- Most releases have nothing parked behind them: one SISMEMBER, not the
    -- five commands of an unpark that finds nothing.
    if redis.call("sismember", KEYS[1] .. ":__parked_keys__", ARGV[i]) == 1 then
        started = started + unpark(KEYS[1], ARGV[i], tonumber(ARGV[i + 2]), now)
        if redis.call("exists", KEYS[1] .. ":__parked__." .. ARGV[i]) == 1 then
            -- The limit the sweep hands slots out under: the releasing job's, which
            -- is current (an override lowered or removed since the park).
            redis.call("hset", KEYS[1] .. ":__slot_limits__", ARGV[i], ARGV[i + 2])
        end
    end
    if redis.call("hlen", slots) == 0 then
        redis.call("srem", KEYS[1] .. ":__slot_keys__", ARGV[i])
    end
end
return started
"""
)

# KEYS: namespace. ARGV: heartbeat timeout (ms), then keys with parked jobs.
# Frees dead holders' slots and starts parked jobs where that made room.
SWEEP = LuaScript(
    _NOW
    + _PRUNE
    + _UNPARK
    + """
local ns, timeout, started = KEYS[1], tonumber(ARGV[1]), 0
for i = 2, #ARGV do
    local limit = tonumber(redis.call("hget", ns .. ":__slot_limits__", ARGV[i]) or "1")
    prune(ns, ns .. ":__slots__." .. ARGV[i], timeout, now)
    started = started + unpark(ns, ARGV[i], limit, now)
end
return started
"""
)

TAKEN, PARKED_NOW, NOT_OURS = 1, 0, 2
# Keys per SWEEP call: a script blocks Redis while it runs.
KEYS_PER_SWEEP = 100
# The heartbeat timeout a sweep outside a worker judges holders with: a day,
# so that it frees no slot (the workers' own sweeps do that) and only starts
# parked jobs where a limit was raised.
HOLDER_TIMEOUT_UNKNOWN = 86_400_000


@dataclass(frozen=True)
class Wanted:
    """A job that wants a slot: its key and limit, message id and redis message id."""

    key: str
    limit: int
    message_id: str
    redis_message_id: str
    actor_name: str = ""  # for the metrics, not sent
    template: str = ""  # the key's template: kept while it has parked jobs (``rehandle``)


def acquire(
    client: Any,
    namespace: str,
    wanted: list[Wanted],
    *,
    broker_id: str,
    queue_name: str,
    timeout_ms: int,
) -> list[tuple[int, float | None]]:
    """Per job: ``TAKEN``, ``PARKED_NOW`` or ``NOT_OURS`` (see ``ACQUIRE``), and
    for a job that waited parked, for how long (seconds; None for the others)."""
    args: list[str | int] = [broker_id, queue_name, timeout_ms]
    for job in wanted:
        args += [job.key, job.limit, job.message_id, job.redis_message_id, job.template]
    reply = ACQUIRE(client, [namespace], args)
    return [
        (int(outcome), None if int(waited) < 0 else int(waited) / 1000)
        for outcome, waited in zip(reply[::2], reply[1::2], strict=True)
    ]


@dataclass(frozen=True)
class Held:
    """A slot to free: the job's key, its message id, the key's limit and the
    delivery's redis message id."""

    key: str
    message_id: str
    limit: int
    redis_message_id: str


def release(client: Any, namespace: str, held: list[Held], *, broker_id: str) -> int:
    """Free the slots of ``held``; the number of parked jobs started."""
    args: list[str | int] = [broker_id]
    for slot in held:
        args += [slot.key, slot.message_id, slot.limit, slot.redis_message_id]
    return int(RELEASE(client, [namespace], args))


def sweep(
    client: Any, namespace: str, *, timeout_ms: int, cursor: int = 0, among: str = PARKED_KEYS
) -> tuple[int, int]:
    """One pass over up to ``KEYS_PER_SWEEP`` keys of ``among``: those with
    parked jobs (``PARKED_KEYS``, each second: jobs wait behind them), or every
    key with a slot (``SLOT_KEYS``: a dead worker's slots on a key nothing waits
    for, which would otherwise stay in Redis). (next cursor, jobs started);
    cursor 0 again means the set was walked through."""
    cursor, keys = client.sscan(f"{namespace}:{among}", cursor, count=KEYS_PER_SWEEP)
    if not keys:
        return int(cursor), 0
    return int(cursor), int(SWEEP(client, [namespace], [timeout_ms, *keys]))


def rehandle(client: Any, namespace: str, limit_of: Callable[[str, str], int | None]) -> int:
    """After a limit changed: each key with parked jobs takes the limit
    ``limit_of(template, key)`` gives (None: its template is not declared here,
    the key is left as it is), and its parked jobs start where that made room.
    The number started."""
    keys = [_text(k) for k in client.smembers(f"{namespace}:{PARKED_KEYS}")]
    templates = client.hmget(f"{namespace}:__slot_templates__", keys) if keys else []
    new_limits = {}
    for key, template in zip(keys, templates, strict=True):
        limit = limit_of(_text(template), key) if template is not None else None
        if limit is not None:
            new_limits[key] = limit
    started = 0
    changed = list(new_limits)
    for start in range(0, len(changed), KEYS_PER_SWEEP):
        chunk = changed[start : start + KEYS_PER_SWEEP]
        client.hset(f"{namespace}:{LIMITS}", mapping={key: new_limits[key] for key in chunk})
        started += int(SWEEP(client, [namespace], [HOLDER_TIMEOUT_UNKNOWN, *chunk]))
    return started


def holders(client: Any, namespace: str, key: str) -> dict[str, str]:
    """The slots of ``key``: message id -> ``W:<broker id>:<redis message id>``
    or ``R:<ms>``."""
    raw = client.hgetall(f"{namespace}:{SLOTS}{key}")
    return {_text(k): _text(v) for k, v in raw.items()}


def parked(client: Any, namespace: str, key: str) -> list[str]:
    """The message ids parked on ``key``, oldest first."""
    return [
        _text(entry).split("\n")[2] for entry in client.lrange(f"{namespace}:{PARKED}{key}", 0, -1)
    ]


def waiting_for(client: Any, namespace: str, message_ids: list[str]) -> dict[str, str]:
    """The key each of ``message_ids`` is parked on, for those parked now."""
    if not message_ids:
        return {}
    found = client.hmget(f"{namespace}:{PARKED_IDS}", message_ids)
    return {mid: _text(key) for mid, key in zip(message_ids, found, strict=True) if key is not None}


def waiting(client: Any, namespace: str) -> dict[str, int]:
    """Parked jobs per key."""
    keys = [_text(key) for key in client.smembers(f"{namespace}:{PARKED_KEYS}")]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.llen(f"{namespace}:{PARKED}{key}")
    return {key: int(count) for key, count in zip(keys, pipe.execute(), strict=True) if count}


@dataclass(frozen=True)
class KeyLoad:
    key: str
    waiting: int  # parked
    running: int  # slots taken (reserved ones included)


def busiest(client: Any, namespace: str, top: int = 10) -> list[KeyLoad]:
    """The keys with the most parked jobs, most first: two round trips. Only
    keys with parked jobs are read (a key whose jobs all run is not busy)."""
    most = sorted(waiting(client, namespace).items(), key=lambda item: (-item[1], item[0]))[:top]
    pipe = client.pipeline(transaction=False)
    for key, _ in most:
        pipe.hlen(f"{namespace}:{SLOTS}{key}")
    running = pipe.execute()
    return [KeyLoad(key, count, int(n)) for (key, count), n in zip(most, running, strict=True)]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
