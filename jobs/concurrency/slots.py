"""The Redis side of per-key concurrency: slots, parked jobs, and their hand-over.

Per key, in the broker's namespace:

- ``__slots__.<key>``: a hash, message id -> holder: ``W:<broker id>:<redis
  message id>`` for a job a worker took (one delivery of it), ``R:<ms>:<redis
  message id>:<parked at (ms)>`` for a parked job a freed slot was handed to
  and that no worker has fetched yet (``R:<ms>:<parked at>`` from releases
  before 2026-12-04).
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

A worker's fetch takes each keyed job's slot as it takes the job
(``FETCH_PREFIX``: the sender wrote the job's key into the message, under
``SEND_OPTION``). When the key is full the fetch parks the job on the key's
list instead of handing it out: no worker thread holds it, no attempt is
spent, and a worker killed afterwards has nothing of it to redeliver. A job
whose message carries no key (an older sender) gets its slot from the
consumer's ``acquire`` after the fetch, by the same rules (``_TAKE``), and
leaves the worker's ack set when parked. A job that ends frees its slot
(``release``) and the script hands it at once to the oldest parked job: it is
put at the head of its queue, with a wake-up token, and its slot is reserved.
A slot whose holder died is freed by the same verdict that redelivers the
holder's jobs (``jobs.broker.clock``: Redis's clock, no verdict in a young
contact period), never while the holder's heartbeat goes on, however slow its job.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

from jobs.broker.limits import CONCURRENCY_KEY
from jobs.broker.scripts import LuaScript
from jobs.concurrency import takes

logger = logging.getLogger(__name__)

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

# A key of another type than the one this code writes there (written by
# hand, or by another application sharing the database), or a count that is
# not a number: Redis refuses the command, and a script that fails keeps what
# it wrote before (Redis has no rollback). A job popped from its queue or its
# parked list would be lost half way. ``misfit``: the first of its (key, type)
# pairs holding another type, as the operator's error text, or nil; each key
# read once per call (only this script writes meanwhile, and only the types it
# checks). ``count_parked``: the per-queue count of parked jobs moved by
# ``by``, its new value; a value that is not a number raises, naming the key.
# ``damage``: the text of a failure caught with ``pcall`` that is the key's
# data (a misfit among the keys given, or the error, naming the first key), or
# nil for a refusal of Redis's own (``refused_by_redis``: a read-only replica,
# a full Redis), which ``raise`` passes on as it came, for redis-py to tell it
# by its prefix. (Redis refuses those at a script's first write, never after.)
_FITS = """
local fits = {}
local function misfit(...)
    local checks = {...}
    for i = 1, #checks, 2 do
        local key, kind = checks[i], checks[i + 1]
        local found = fits[key]
        if found == nil then
            found = redis.call("type", key)["ok"]
            if found == "none" then
                found = kind
            end
            fits[key] = found
        end
        if found ~= kind then
            return key .. " holds a " .. found .. ", not a " .. kind
        end
    end
    return nil
end
local REDIS_REFUSALS = {
    OOM = true, READONLY = true, NOREPLICAS = true, MASTERDOWN = true, MISCONF = true,
    BUSY = true, LOADING = true, TRYAGAIN = true, CLUSTERDOWN = true,
}
local function text_of(err)
    return type(err) == "table" and err.err or tostring(err)
end
local function refused_by_redis(err)
    return REDIS_REFUSALS[string.match(text_of(err), "^(%u+) ") or ""] ~= nil
end
local function raise(err)
    if type(err) ~= "table" then
        err = {err = tostring(err)}
    end
    error(err, 0)
end
local function count_parked(ns, queue, by)
    local counts = ns .. ":__parked_per_queue__"
    local ok, n = pcall(redis.call, "hincrby", counts, queue, by)
    if not ok then
        if refused_by_redis(n) then
            raise(n)
        end
        error(counts .. " holds a count for queue " .. queue .. " that is not a number", 0)
    end
    return n
end
local function damage(err, key, ...)
    if refused_by_redis(err) then
        return nil
    end
    local text = text_of(err)
    if string.find(text, " holds a", 1, true) then
        return text
    end
    return misfit(key, ...) or ("a command on " .. key .. " failed: " .. text)
end
"""

# Frees the slots of dead holders and of reservations never claimed. A holder
# is dead as maintenance judges it (jobs.broker.clock): no heartbeat within the
# timeout, and a contact period at least that old. ``me``, ``upto`` and
# ``live`` (a worker's own sweep): its broker id, and the take tokens that may
# still hold its slots (``jobs.concurrency.takes``): those in ``live`` and
# from ``upto`` on. Its slots under another token are freed, whatever its
# heartbeat says (a release Redis lost, a take whose reply was lost).
_PRUNE = """
local function prune(ns, slots, timeout, now, me, upto, live)
    local since = tonumber(redis.call("get", ns .. ":__contact_since__") or "0")
    local judge = now - since >= timeout
    local entries = redis.call("hgetall", slots)
    -- Each holder's last beat, read once per worker: a shared key's slots are
    -- hundreds of one or two workers' jobs, and a ZSCORE each made a sweep of
    -- 600 such slots block Redis 0.9 ms (0.4 ms now), once a second per worker.
    local beats = {}
    for i = 1, #entries, 2 do
        local kind, value = string.sub(entries[i + 1], 1, 1), string.sub(entries[i + 1], 3)
        if kind == "R" then
            -- (A reservation without its time, which this code never writes,
            -- is freed: it would hold a slot for ever.)
            local at = tonumber(string.match(value, "^%d+") or "")
            if not at or now - at >= timeout then
                redis.call("hdel", slots, entries[i])
            end
        else
            local broker_id = string.match(value, "^[^:]*")
            local token = broker_id == me and string.match(value, ":(%d+)$")
            if token and tonumber(token) < upto and not live[token] then
                redis.call("hdel", slots, entries[i])
            elseif judge then
                local last = beats[broker_id]
                if last == nil then
                    last = redis.call("zscore", ns .. ":__heartbeats__", broker_id)
                    beats[broker_id] = last  -- (false: no beat)
                end
                if not last or now - tonumber(last) >= timeout then
                    redis.call("hdel", slots, entries[i])
                end
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
    local started, kept = 0, {}
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
        -- Another copy of the same message runs, its slot held under this
        -- message id: a reservation would overwrite that holder, and two jobs
        -- would run on one slot. This copy keeps its place until that one ends.
        local held = message_id and redis.call("hget", slots, message_id)
        if held and string.sub(held, 1, 1) == "W" then
            kept[#kept + 1] = entry
        else
            local bad = queue and misfit(
                ns .. ":__parked_ids__", "hash", ns .. ":__parked_since__." .. queue, "zset",
                ns .. ":__parked_per_queue__", "hash", ns .. ":" .. queue .. ".msgs", "hash",
                ns .. ":__slot_keys__", "set", ns .. ":" .. queue, "list",
                ns .. ":" .. queue .. ".wake", "list"
            )
            -- The one write that may refuse on a value, first (``_FITS``).
            local ok, left = true, 1
            if queue and not bad then
                ok, left = pcall(count_parked, ns, queue, -1)
                bad = not ok and left
            end
            if bad then
                -- Back where it was, with those kept ahead of it: the job
                -- waits until the key is repaired (each release and sweep of
                -- the key reports it) rather than being lost.
                redis.call("lpush", parked, entry)
                for i = #kept, 1, -1 do
                    redis.call("lpush", parked, kept[i])
                end
                error(bad, 0)
            end
            if message_id then
                redis.call("hdel", ns .. ":__parked_ids__", message_id)
            end
            if queue then
                redis.call("zrem", ns .. ":__parked_since__." .. queue, message_id)
            end
            if queue and left <= 0 then
                redis.call("hdel", ns .. ":__parked_per_queue__", queue)
            end
            if queue and redis.call("hexists", ns .. ":" .. queue .. ".msgs", redis_id) == 1 then
                redis.call(
                    "hset", slots, message_id, "R:" .. now .. ":" .. redis_id .. ":" .. parked_at
                )
                redis.call("sadd", ns .. ":__slot_keys__", key)
                redis.call("lpush", ns .. ":" .. queue, redis_id)
                local wake = ns .. ":" .. queue .. ".wake"
                if redis.call("llen", wake) < 64 then
                    redis.call("lpush", wake, 1)
                end
                started = started + 1
            end
        end
    end
    for i = #kept, 1, -1 do
        redis.call("lpush", parked, kept[i])
    end
    if redis.call("llen", parked) == 0 then
        redis.call("srem", ns .. ":__parked_keys__", key)
        redis.call("hdel", ns .. ":__slot_limits__", key)
        redis.call("hdel", ns .. ":__slot_templates__", key)
    end
    return started
end
"""

# Takes a slot for one job, or parks it. (outcome, waited): 1, the slot is the
# job's; 0, parked; 2, the job is no longer in this worker's ack set (``acks``;
# maintenance handed it back: this worker was judged dead), so it is neither
# run nor parked here. Raises, having written nothing of the job, when a key
# it would write holds another type (``_FITS``); a caller's ``pcall`` makes
# that outcome 3, the key unusable, with the reason in place of the wait (a
# prune may have freed dead holders' slots before: those stay freed).
# ``acks`` is nil for a job the fetch has just taken from its queue
# (``FETCH_PREFIX``): not in any ack set yet, it has nothing to leave.
# waited: how long a job a freed slot was reserved for had been parked (ms),
# or -1. ``counted``: slots held per key as this script has counted them (one
# HLEN per key and call, not per job: the script alone writes them meanwhile).
# ``token``: the calling worker's take token (``jobs.concurrency.takes``).
_TAKE = """
local function take(
    ns, broker_id, queue, key, limit, message_id, redis_id, template, timeout, now, acks,
    counted, token
)
    local slots = ns .. ":__slots__." .. key
    -- Per take, not per message: a second copy of the same message (sent
    -- again, or a retry whose first attempt's release is still pending) is
    -- another job for the limit, and so is an earlier take of this delivery
    -- (fetched again while that take's release is pending); only this take
    -- asking again is not.
    local holder = "W:" .. broker_id .. ":" .. redis_id .. ":" .. token
    local first = counted[key] == nil
    local taken = counted[key] or redis.call("hlen", slots)
    -- The common case in one command: a free slot the message does not hold
    -- yet. A redis.call costs Redis about a microsecond beyond the command's
    -- own work; a take was four, a fifth of a no-op job's cost in Redis.
    -- Among the keys with slots, for the sweep of dead holders' slots: once a
    -- key and call (and again after a prune emptied the hash), which also puts
    -- back a key someone took out by hand. Before the slot is written: every
    -- write of a take comes after the commands that may refuse it (``_FITS``).
    if taken < limit and (first or taken == 0) then
        redis.call("sadd", ns .. ":__slot_keys__", key)
    end
    if taken < limit and redis.call("hsetnx", slots, message_id, holder) == 1 then
        counted[key] = taken + 1
        return 1, -1
    end
    local mine = redis.call("hget", slots, message_id)
    local waited = -1
    -- This delivery's own slot: its reservation, or (ACQUIRE, for a job in the
    -- ack set) a slot this take holds already. A slot under the message's id
    -- held by another take (of a twin copy, or of this delivery fetched before:
    -- its release pending while Redis was away, a worker judged dead too early)
    -- is freed by that take's release; taking it now would run two jobs on one
    -- slot, so the job waits behind it.
    local own = mine and (string.sub(mine, 1, 1) == "R" or (acks and mine == holder))
    if own then
        if string.sub(mine, 1, 1) == "R" then
            local at = tonumber(string.match(mine, "(%d+)$") or "")
            waited = at and now - at or -1
        end
    else
        if taken >= limit then
            prune(ns, slots, timeout, now)
            taken = redis.call("hlen", slots)
            counted[key] = taken
            mine = redis.call("hget", slots, message_id)
        end
        if mine or taken >= limit then
            -- (Asked first: a job maintenance handed back is another worker's
            -- to run, whatever this one finds wrong with its key.)
            if acks and redis.call("sismember", acks, redis_id) == 0 then
                return 2, waited
            end
            local parked, since = ns .. ":__parked__." .. key, ns .. ":__parked_since__." .. queue
            local bad = misfit(
                parked, "list", ns .. ":__parked_per_queue__", "hash",
                ns .. ":__parked_ids__", "hash", since, "zset", ns .. ":__parked_keys__", "set",
                ns .. ":__slot_limits__", "hash", ns .. ":__slot_templates__", "hash"
            )
            if bad then
                error(bad, 0)
            end
            count_parked(ns, queue, 1)  -- (the one write that may refuse on a value: first)
            if acks then
                redis.call("srem", acks, redis_id)
            end
            local entry = queue .. "\\n" .. redis_id .. "\\n" .. message_id .. "\\n" .. now
            redis.call("rpush", parked, entry)
            redis.call("hset", ns .. ":__parked_ids__", message_id, key)
            redis.call("zadd", since, now, message_id)
            redis.call("sadd", ns .. ":__parked_keys__", key)
            redis.call("hset", ns .. ":__slot_limits__", key, limit)
            redis.call("hset", ns .. ":__slot_templates__", key, template)
            return 0, waited
        end
    end
    redis.call("sadd", ns .. ":__slot_keys__", key)
    redis.call("hset", slots, message_id, holder)
    counted[key] = own and taken or taken + 1  -- (a slot it held already is counted)
    return 1, waited
end
"""

# KEYS: namespace. ARGV: broker id, queue, heartbeat timeout (ms), take token,
# then per job its key, limit, message id, redis message id and template. Per job its
# outcome and wait (``_TAKE``). One call per fetch, for jobs the fetch could not
# take slots for (``FETCH_PREFIX``: sent by an older release, or while a key
# pattern's limit is overridden): a round trip per job from the consumer
# thread, which every job goes through, cost 60% of the throughput.
ACQUIRE = LuaScript(
    _NOW
    + _FITS
    + _PRUNE
    + _TAKE
    + """
local ns, broker_id, queue, timeout = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local token = ARGV[4]
local acks = ns .. ":__acks__." .. broker_id .. "." .. queue
local outcomes, counted = {}, {}
for i = 5, #ARGV, 5 do
    local ok, outcome, waited = pcall(
        take, ns, broker_id, queue, ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3],
        ARGV[i + 4], timeout, now, acks, counted, token
    )
    if not ok then
        local reason = damage(
            outcome, ns .. ":__slots__." .. ARGV[i], "hash", ns .. ":__slot_keys__", "set",
            ns .. ":__contact_since__", "string", ns .. ":__heartbeats__", "zset"
        )
        if not reason then
            raise(outcome)  -- (before this call's first write: nothing taken)
        end
        outcome, waited = 3, reason
    end
    outcomes[#outcomes + 1] = outcome
    outcomes[#outcomes + 1] = waited
end
return outcomes
"""
)

# The message option the sender writes a job's key into (``keys.send_key``),
# so that the fetch can take its slot: Redis cannot build a key from the
# arguments. A script reads it with cjson, only from payloads that name it.
SEND_OPTION = CONCURRENCY_KEY  # a delivery option: not counted by the size limit
# Jobs a fetch may park before it returns what it has: a script blocks Redis
# while it runs, and a queue can hold thousands of one full key's jobs.
PARK_PER_FETCH = 100

# In the dispatch script, after the fair prefix (whose chosen jobs are at the
# head of the queue's list by then) and before dispatch.lua. With ARGV[10]
# "slots" (the consumer's ``fetch_args``: its take token in ARGV[11], then the
# keyed actors of this queue, each with its limit and template) this prefix is
# the fetch: it takes each job as dispatch.lua's fetch does (into this
# worker's ack set) and its slot with it, or parks it, so the consumer thread
# has no second round trip to make. A job
# without the option (sent by an older release), of an actor not listed, or
# whose payload is not JSON is taken as it is, for the consumer's ``acquire``.
# dispatch.lua then fetches nothing (its heartbeat and maintenance still run),
# and the wrapper (``wrap_dispatch``) replies with ``jobs_fetched``, the
# payloads, followed by ``jobs_slot_info``: the jobs whose slot it took and
# that had not waited (message id, key and actor, tab-separated, in one
# string), then per other job it decided on its message id, outcome, wait
# (ms, -1), key and actor.
FETCH_PREFIX = (
    'if ARGV[1] == "fetch" and ARGV[10] == "slots" then\n'
    + _FITS
    + _PRUNE
    + _TAKE
    + f"""
    -- What this checks is cheap: a table with Dramatiq's fields of the right
    -- types, and a key and message id of printable ASCII (others go the
    -- ACQUIRE way: Python reads them, the reply carries them as text). A
    -- payload cjson reads and the worker's Python refuses (a hex number, a
    -- newer sender's field, bytes that are not UTF-8) still gets its slot
    -- here: the consumer that fails to decode it frees the slot
    -- (``LedgerOrderedConsumer.close``). Scanning every payload for those
    -- cost Redis 6 us a job, more than cjson's decode.
    local function a_message(message)
        return type(message) == "table" and type(message.options) == "table"
            and type(message.actor_name) == "string" and type(message.message_id) == "string"
    end
    -- The common case, a slot taken for a job that had not waited, as one
    -- string (message id, key, actor, tab-separated: neither holds a tab):
    -- five reply entries a job cost the consumer's parser 12 us, this 3.
    local taken, n_taken = {{}}, 0
    jobs_slot_info = {{false}}
    jobs_fetched = {{}}
    local ns, queue, broker_id = KEYS[1], ARGV[3], ARGV[4]
    local timeout = tonumber(ARGV[5])
    local token = ARGV[11]
    local declared = {{}}
    for i = 12, #ARGV, 3 do
        declared[ARGV[i]] = {{tonumber(ARGV[i + 1]), ARGV[i + 2]}}
    end
    local queue_key = ns .. ":" .. queue
    local messages = queue_key .. ".msgs"
    local acks = ns .. ":__acks__." .. broker_id .. "." .. queue
    local want = math.min(tonumber(ARGV[9]), tonumber(ARGV[8]))
    local may_park = {PARK_PER_FETCH}
    local counted, fetched_ids = {{}}, {{}}
    -- The jobs a round at a time (one LPOP with a count, one HMGET), and
    -- into the ack set with one SADD: a command a job cost Redis as much as
    -- what the command did. A round takes no more than may still park, so
    -- that a full key's backlog never parks more than PARK_PER_FETCH.
    while #jobs_fetched < want and may_park > 0 do
        local ids = redis.call("lpop", queue_key, math.min(want - #jobs_fetched, may_park))
        if not ids then
            break
        end
        local payloads = redis.call("hmget", messages, unpack(ids))
        for i = 1, #ids do
            local redis_id, data = ids[i], payloads[i]
            local outcome = 1
            if data and string.find(data, '"{SEND_OPTION}"', 1, true) then
                local ok, message = pcall(cjson.decode, data)
                if ok and a_message(message) then
                    local key = message.options.{SEND_OPTION}
                    local declaration = declared[message.actor_name]
                    local message_id = message.message_id
                    if declaration and type(key) == "string" and key ~= ""
                            and not string.find(key, "[^\\32-\\126]")
                            and not string.find(message_id, "[^\\32-\\126]") then
                        local ok, waited
                        ok, outcome, waited = pcall(
                            take, ns, broker_id, queue, key, declaration[1], message_id,
                            redis_id, declaration[2], timeout, jobs_now, nil, counted, token
                        )
                        if not ok then  -- (handed out, to fail for good: never lost)
                            -- (Any failure: a refusal of Redis's own comes
                            -- at the first write, the LPOP, never after it.)
                            local text = type(outcome) == "table" and outcome.err or outcome
                            outcome, waited = 3, damage(
                                outcome, ns .. ":__slots__." .. key, "hash",
                                ns .. ":__slot_keys__", "set", ns .. ":__contact_since__",
                                "string", ns .. ":__heartbeats__", "zset"
                            ) or tostring(text)
                        end
                        if outcome == 1 and waited < 0 then
                            taken[n_taken + 1] = message_id
                            taken[n_taken + 2] = key
                            taken[n_taken + 3] = message.actor_name
                            n_taken = n_taken + 3
                        else
                            local info = jobs_slot_info
                            info[#info + 1] = message_id
                            info[#info + 1] = outcome
                            info[#info + 1] = waited
                            info[#info + 1] = key
                            info[#info + 1] = message.actor_name
                        end
                    end
                end
            end
            if outcome ~= 0 then
                fetched_ids[#fetched_ids + 1] = redis_id
                jobs_fetched[#jobs_fetched + 1] = data
            else
                may_park = may_park - 1
            end
        end
    end
    if #fetched_ids > 0 then
        redis.call("sadd", acks, unpack(fetched_ids))
    end
    jobs_slot_info[1] = table.concat(taken, "\\t")
    ARGV[9] = "0"  -- dispatch.lua's fetch: nothing left to take
end
"""
)


class Decided(NamedTuple):
    """What a fetch with slots decided for one keyed job (``FETCH_PREFIX``)."""

    message_id: str
    outcome: int  # TAKEN, PARKED_NOW or UNUSABLE
    waited: float | None  # seconds it had waited parked, for a reserved slot
    key: str
    actor_name: str
    token: int  # the take's (``jobs.concurrency.takes``)
    by_fetch: bool = True  # (False: by the consumer's ACQUIRE)
    reason: str = ""  # why the key is UNUSABLE


def decided(info: list[Any], token: int) -> list[Decided]:
    """``jobs_slot_info``, the last element of the reply to the fetch of take
    token ``token``, per job."""
    fields = _text(info[0]).split("\t") if info[0] else []
    jobs = [
        Decided(fields[i], TAKEN, None, fields[i + 1], fields[i + 2], token)
        for i in range(0, len(fields), 3)
    ]
    for i in range(1, len(info), 5):
        outcome = Outcome.of(info[i + 1], info[i + 2])
        jobs.append(
            Decided(
                _text(info[i]),
                outcome.outcome,
                outcome.waited,
                _text(info[i + 3]),
                _text(info[i + 4]),
                token,
                reason=outcome.reason,
            )
        )
    return jobs


def wrap_dispatch(body: str) -> str:
    """The dispatch script: ``body`` (prefixes and dispatch.lua) run as a
    function, whose reply to a fetch with slots is the prefix's
    (``FETCH_PREFIX``)."""
    return (
        "local jobs_slot_info, jobs_fetched\nlocal function jobs_dispatch()\n"
        + body
        + "\nend\nlocal jobs_reply = jobs_dispatch()\n"
        + "if jobs_slot_info then\n"
        + "    jobs_reply = jobs_fetched\n"
        + "    jobs_reply[#jobs_reply + 1] = jobs_slot_info\n"
        + "end\nreturn jobs_reply\n"
    )


# KEYS: namespace. ARGV: broker id, then the jobs as JSON, grouped by key:
# [[key, limit, [message id, ...], [redis message id ("": any delivery of
# this worker), ...], [take token (0: any take of the delivery), ...]], ...],
# at most ``GROUP_MAX`` jobs a group. Frees each job's slot (held by this
# take, or reserved for the delivery; not a slot another copy of the same
# message holds, nor a later take of the same delivery) and hands what is free
# to parked jobs; returns how many it started, the keys that had jobs parked
# (``waited``), and per key it could not use (``_FITS``) the key and why. One
# JSON argument rather than four a job: on this project's 2-core VM each
# argument cost the release thread about 1.8 us of CPU (redis-py encodes and
# checks each one), the largest share of a keyed job's cost in the worker; and
# a key's own commands run once per group.
RELEASE = LuaScript(
    _NOW
    + _FITS
    + _UNPARK
    + """
local started, waited, refused = 0, {}, {}
local prefix = "W:" .. ARGV[1] .. ":"
local function release(group)
    local key, limit, message_ids, redis_ids = group[1], group[2], group[3], group[4]
    local tokens = group[5] or {}
    local slots = KEYS[1] .. ":__slots__." .. key
    -- A key's holders in one HMGET and its freed slots in one HDEL: a
    -- command a job cost Redis about as much as what the command did.
    local holders, freed = redis.call("hmget", slots, unpack(message_ids)), 0
    for j = 1, #message_ids do
        local redis_id, token = redis_ids[j], tokens[j] or 0
        local holder = prefix .. redis_id
        local held = holders[j]
        -- A reservation: only for this delivery (a job handed back before it
        -- took the slot), so that a release sent again (its reply lost) does
        -- not free the slot its first sending handed to another copy of the
        -- message. One that does not say for whom (an older release's): any.
        -- No redis message id: whichever delivery of this worker holds it (the
        -- slot of a payload its consumer could not decode; one slot per message id).
        local reserved_for = held and string.sub(held, 1, 1) == "R"
            and (string.match(held, "^R:%d+:(.*):%d+$") or redis_id)
        -- A take this process cannot name (0): any take of the delivery.
        if held and (held == holder .. ":" .. token or reserved_for == redis_id
                or (token == 0 and (held == holder
                    or string.sub(held, 1, #holder + 1) == holder .. ":"))
                or (redis_id == ""
                    and (reserved_for or string.sub(held, 1, #holder) == holder))) then
            freed = freed + 1
            holders[freed] = message_ids[j]  -- (the reply's table, reused)
        end
    end
    if freed > 0 then
        redis.call("hdel", slots, unpack(holders, 1, freed))
    end
    -- Most releases have nothing parked behind them: one SISMEMBER, not the
    -- five commands of an unpark that finds nothing.
    if redis.call("sismember", KEYS[1] .. ":__parked_keys__", key) == 1 then
        waited[#waited + 1] = key
        started = started + unpark(KEYS[1], key, limit, now)
        if redis.call("exists", KEYS[1] .. ":__parked__." .. key) == 1 then
            -- The limit the sweep hands slots out under: the releasing job's, which
            -- is current (an override lowered or removed since the park).
            redis.call("hset", KEYS[1] .. ":__slot_limits__", key, limit)
        end
    end
    if redis.call("hlen", slots) == 0 then
        redis.call("srem", KEYS[1] .. ":__slot_keys__", key)
    end
end
-- One key's data of another type refuses that key's group, not the batch:
-- the releases of every other key (this worker's, for a second) go on.
for _, group in ipairs(cjson.decode(ARGV[2])) do
    local ok, err = pcall(release, group)
    if not ok then
        local ns, key = KEYS[1], group[1]
        local reason = damage(
            err, ns .. ":__slots__." .. key, "hash", ns .. ":__parked_keys__", "set",
            ns .. ":__parked__." .. key, "list", ns .. ":__slot_keys__", "set",
            ns .. ":__slot_limits__", "hash"
        )
        if not reason then
            raise(err)  -- (at the first write: the batch is sent again)
        end
        refused[#refused + 1] = key
        refused[#refused + 1] = reason
    end
end
return {started, waited, refused}
"""
)

# KEYS: namespace. ARGV: heartbeat timeout (ms), the sweeping worker's broker
# id, its next take token and its live ones, comma-separated (``_PRUNE``), then
# keys with parked jobs. Frees dead holders' slots and starts parked jobs where
# that made room; returns how many it started, then per key it could not use
# (``_FITS``) the key and why.
SWEEP = LuaScript(
    _NOW
    + _FITS
    + _PRUNE
    + _UNPARK
    + """
local ns, timeout, started = KEYS[1], tonumber(ARGV[1]), 0
local me, upto, live = ARGV[2], tonumber(ARGV[3]), {}
for token in string.gmatch(ARGV[4], "%d+") do
    live[token] = true
end
local function sweep(key)
    local limit = tonumber(redis.call("hget", ns .. ":__slot_limits__", key) or "1") or 1
    prune(ns, ns .. ":__slots__." .. key, timeout, now, me, upto, live)
    started = started + unpark(ns, key, limit, now)
end
local reply = {0}
for i = 5, #ARGV do
    local ok, err = pcall(sweep, ARGV[i])
    if not ok then  -- (the other keys are swept: see RELEASE)
        local key = ARGV[i]
        local reason = damage(
            err, ns .. ":__slots__." .. key, "hash", ns .. ":__parked__." .. key, "list",
            ns .. ":__slot_limits__", "hash", ns .. ":__slot_keys__", "set",
            ns .. ":__parked_keys__", "set", ns .. ":__contact_since__", "string",
            ns .. ":__heartbeats__", "zset"
        )
        if not reason then
            raise(err)
        end
        reply[#reply + 1] = key
        reply[#reply + 1] = reason
    end
end
reply[1] = started
return reply
"""
)

TAKEN, PARKED_NOW, NOT_OURS, UNUSABLE = 1, 0, 2, 3


class Outcome(NamedTuple):
    """A take's outcome (``_TAKE``): for a job that waited parked, for how long
    (seconds; None for the others); for an ``UNUSABLE`` key, why."""

    outcome: int
    waited: float | None
    reason: str = ""

    @classmethod
    def of(cls, outcome: Any, waited: Any) -> Outcome:
        """From a script's reply: ``waited`` is the reason of an unusable key."""
        if int(outcome) == UNUSABLE:
            return cls(UNUSABLE, None, _text(waited))
        return cls(int(outcome), None if int(waited) < 0 else int(waited) / 1000)


# Jobs of one key per group of a RELEASE: its HMGET and HDEL pass them as
# arguments (Lua's unpack), which Redis's Lua stack holds up to about 8,000.
GROUP_MAX = 1000
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
    token: int | None = None,
) -> list[Outcome]:
    """Per job: ``TAKEN``, ``PARKED_NOW``, ``NOT_OURS`` or ``UNUSABLE`` (see
    ``_TAKE``), and for a job that waited parked, for how long. ``token``: the
    take token (``jobs.concurrency.takes``) the caller got for this call, which
    it ends; a new one without."""
    book = takes.of(broker_id)
    if token is None:
        token = book.call()
    taken: list[str] = []
    try:
        args: list[str | int] = [broker_id, queue_name, timeout_ms, token]
        for job in wanted:
            args += [job.key, job.limit, job.message_id, job.redis_message_id, job.template]
        reply = ACQUIRE(client, [namespace], args)
        outcomes = [Outcome.of(*pair) for pair in zip(reply[::2], reply[1::2], strict=True)]
        taken = [job.message_id for job, o in zip(wanted, outcomes, strict=True) if o[0] == TAKEN]
    finally:
        book.called(token, taken)
    return outcomes


class Held(NamedTuple):
    """A slot to free: the job's key, its message id, the key's limit, the
    delivery's redis message id and the take token (0: any take of the
    delivery). (A tuple: one is built after every keyed job, in a third of a
    frozen dataclass's time.)"""

    key: str
    message_id: str
    limit: int
    redis_message_id: str
    token: int = 0


def release(client: Any, namespace: str, held: list[Held], *, broker_id: str) -> int:
    """Free the slots of ``held``; the number of parked jobs started. The keys
    that had jobs parked are noted as waited for (``waited_for``)."""
    reply = RELEASE(client, [namespace], release_args(held, broker_id=broker_id))
    return released(reply, held, broker_id=broker_id)


def release_args(held: list[Held], *, broker_id: str) -> list[str | int]:
    """``RELEASE``'s ARGV for ``held`` (its KEYS: the namespace), for a caller
    that sends it in a pipeline of its own (``jobs.broker.acks``)."""
    groups: dict[str, tuple[list[str], list[str], list[int]]] = {}
    # One group per key, under the limit of its last job: the most recent
    # release, so the current limit (an override may change mid-batch).
    limit: dict[str, int] = {}
    for slot in held:
        message_ids, redis_ids, tokens = groups.setdefault(slot.key, ([], [], []))
        # str(): Dramatiq decodes a message id that is a JSON number as one;
        # ACQUIRE took its slot under redis-py's spelling (repr, the same as
        # str), which a JSON number read by cjson would not keep.
        message_ids.append(str(slot.message_id))
        redis_ids.append(str(slot.redis_message_id))
        tokens.append(slot.token)
        limit[slot.key] = slot.limit
    # Either form reaches Lua as the UTF-8 bytes redis-py sends for the key
    # elsewhere (cjson decodes JSON's escapes); without escapes it is shorter.
    jobs_json = json.dumps(
        [
            [
                key,
                limit[key],
                message_ids[i : i + GROUP_MAX],
                redis_ids[i : i + GROUP_MAX],
                tokens[i : i + GROUP_MAX],
            ]
            for key, (message_ids, redis_ids, tokens) in groups.items()
            for i in range(0, len(message_ids), GROUP_MAX)
        ],
        ensure_ascii=False,
    )
    return [broker_id, jobs_json]


def released(reply: list[Any], held: list[Held], *, broker_id: str) -> int:
    """``RELEASE``'s reply to the release of ``held``: the number of parked
    jobs it started; the keys that had jobs parked are noted as waited for
    (``waited_for``), and the takes as released (``jobs.concurrency.takes``)."""
    takes.of(broker_id).released((slot.message_id, slot.token) for slot in held)
    started, waited, refused = reply
    for key in waited:
        note_waited(_text(key))
    _report_unusable(refused, "its slots may stay taken and its parked jobs wait")
    return int(started)


# Reason -> when (monotonic) it was last reported: a worker releases and
# sweeps many times a second, the operator needs it once a while. By reason,
# which names the Redis key: a damaged index refuses every key that uses it.
_reported: dict[str, float] = {}
_reported_lock = threading.Lock()  # (the job-slots thread and the acks' thread report)
REPORT_EVERY_S = 60.0
_REPORTED_MAX = 1_000


def _report_unusable(refused: list[Any], consequence: str) -> None:
    """Log each key a script could not use (pairs: key, reason), once a while."""
    for key, reason in zip(refused[::2], refused[1::2], strict=True):
        what = f"Concurrency key {_text(key)!r} cannot be used: {_text(reason)}"
        report_damage(what, consequence)


def report_damage(what: str, consequence: str) -> None:
    """Log at ERROR that the platform's data in Redis is damaged (``what``),
    once a minute for the same text."""
    text, now = what.rstrip("."), time.monotonic()
    with _reported_lock:
        if now - _reported.get(text, float("-inf")) < REPORT_EVERY_S:
            return
        if len(_reported) >= _REPORTED_MAX:
            for old in [r for r, at in _reported.items() if now - at >= REPORT_EVERY_S]:
                del _reported[old]
            if len(_reported) >= _REPORTED_MAX:
                return  # (a thousand damaged keys a minute: enough said)
        _reported[text] = now
    logger.error(
        "%s. Only this platform writes these keys: delete or repair it (%s meanwhile).",
        text,
        consequence,
    )


# Key -> until when (monotonic) this process counts it as having jobs that wait
# for its slots: seen parked by this process's fetch, or by a release of it.
# The job-slots thread frees such a key's slots at once and lets the others
# gather (jobs.middleware.concurrency). A hint only: a key missing here costs
# its first waiting job at most the gathering time.
_waited: dict[str, float] = {}
WAITED_FOR_S = 10.0
_WAITED_MAX = 10_000


def note_waited(key: str) -> None:
    if len(_waited) >= _WAITED_MAX:
        now = time.monotonic()
        entries = list(_waited.items())  # (one C call: other threads add keys meanwhile)
        for old in [k for k, until in entries if until < now] or [k for k, _ in entries]:
            _waited.pop(old, None)
    _waited[key] = time.monotonic() + WAITED_FOR_S


def waited_for(key: str) -> bool:
    return _waited.get(key, 0.0) > time.monotonic()


def sweep(
    client: Any,
    namespace: str,
    *,
    timeout_ms: int,
    cursor: int = 0,
    among: str = PARKED_KEYS,
    broker_id: str = "",
) -> tuple[int, int]:
    """One pass over up to ``KEYS_PER_SWEEP`` keys of ``among``: those with
    parked jobs (``PARKED_KEYS``, each second: jobs wait behind them), or every
    key with a slot (``SLOT_KEYS``: a dead worker's slots on a key nothing waits
    for, which would otherwise stay in Redis). ``broker_id``: the sweeping
    worker's, whose own slots under takes it no longer holds are freed too
    (``jobs.concurrency.takes``). (next cursor, jobs started); cursor 0 again
    means the set was walked through."""
    # Read before the sweep: a take after this point has a token from ``next`` on.
    next_token, live = takes.of(broker_id).settled() if broker_id else (0, set())
    try:
        cursor, keys = client.sscan(f"{namespace}:{among}", cursor, count=KEYS_PER_SWEEP)
    except redis.ResponseError as exc:
        if not str(exc).startswith("WRONGTYPE"):
            raise
        # The index itself damaged (``_FITS``): the other one is swept still.
        found = _text(client.type(f"{namespace}:{among}"))
        report_damage(f"{namespace}:{among} holds a {found}, not a set", "its keys are not swept")
        return 0, 0
    if not keys:
        return int(cursor), 0
    live_tokens = ",".join(map(str, sorted(live)))
    args = [timeout_ms, broker_id, next_token, live_tokens, *keys]
    return int(cursor), _swept(SWEEP(client, [namespace], args))


def _swept(reply: list[Any]) -> int:
    """``SWEEP``'s reply: the number of parked jobs it started."""
    _report_unusable(reply[1:], "dead holders' slots are not freed and its parked jobs wait")
    return int(reply[0])


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
        started += _swept(SWEEP(client, [namespace], [HOLDER_TIMEOUT_UNKNOWN, "", 0, "", *chunk]))
    return started


def holders(client: Any, namespace: str, key: str) -> dict[str, str]:
    """The slots of ``key``: message id -> ``W:<broker id>:<redis message id>``
    or ``R:<ms>:<redis message id>:<parked at (ms)>``."""
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
    try:
        found = client.hmget(f"{namespace}:{PARKED_IDS}", message_ids)
    except redis.ResponseError as exc:  # (damaged: ``_damaged``)
        _damaged(exc, "jobs are not shown waiting for their keys")
        return {}
    return {mid: _text(key) for mid, key in zip(message_ids, found, strict=True) if key is not None}


def waiting(client: Any, namespace: str) -> dict[str, int]:
    """Parked jobs per key (a key whose list is damaged left out, ``_damaged``)."""
    try:
        keys = [_text(key) for key in client.smembers(f"{namespace}:{PARKED_KEYS}")]
    except redis.ResponseError as exc:
        _damaged(exc, "no key is shown with jobs waiting")
        return {}
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.llen(f"{namespace}:{PARKED}{key}")
    counts = {}
    for key, count in zip(keys, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(count, Exception):
            _damaged(count, f"key {key!r} is not shown with its waiting jobs")
        elif count:
            counts[key] = int(count)
    return counts


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
    running = pipe.execute(raise_on_error=False)
    return [
        KeyLoad(key, count, 0 if isinstance(n, Exception) else int(n))
        for (key, count), n in zip(most, running, strict=True)
    ]


def _damaged(exc: Exception, consequence: str) -> None:
    """A read of the platform's keys Redis refused for their type (WRONGTYPE:
    damaged, ``_FITS``): reported, for the console to show what it can. Any
    other refusal is raised."""
    if not str(exc).startswith("WRONGTYPE"):
        raise exc
    report_damage(f"A concurrency key's data in Redis is damaged ({exc})", consequence)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
