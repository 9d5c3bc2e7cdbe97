"""Fair queueing: a queue serves the keys of an actor's jobs in turn.

``@dramatiq.actor(fairness_key="tenant:{tenant_id}")`` keeps a tenant that sends
10,000 jobs from delaying another tenant's 100 behind them. Per queue, in the
broker's namespace (``:`` cannot be part of a queue name, so none of these is
another queue's key):

- ``<queue>:fair:k:<key>``: that key's waiting jobs, oldest first, each
  ``<ms on Redis's clock>|<redis message id>`` (the payload is in ``<queue>.msgs``, as
  for any message);
- ``<queue>:fair:turns``: the keys with jobs waiting, in the order they get
  their next turn;
- ``<queue>:fair:heads``: each such key scored by when its oldest job was
  enqueued, for the age of the queue's oldest waiting job;
- ``<queue>:fair``: ``jobs``, how many jobs the key lists hold, and
  ``plain_next``, whose turn it is.

A fetch (``FETCH_PREFIX``, before dispatch.lua's own) takes one job of the key
whose turn it is and passes the turn on, and alternates with the queue's own
list: the messages without a key (and every message a worker hands back) take
their turns as one key of their own. The ids taken are put at the head of the
queue's list, where dispatch.lua's fetch pops exactly them, so acks, requeues,
a dead worker's messages going back and the delay queue are Dramatiq's own.

The key lists are kept out of the queue's list: a process that does not know
them (an older release in a rolling deploy) never takes a fair job for
something else; it leaves them to the processes that do. Before rolling back to
such a release, ``manage.py jobs unwind-fair QUEUE`` moves them back into the
queue's list (``unwind``).
"""

from __future__ import annotations

from typing import Any

import dramatiq

from jobs.concurrency.keys import ConcurrencyKeyError, KeyTemplate, checked_template

OPTION = "fairness_key"

# Actor name -> its fairness key template, filled as actors are declared.
_declared: dict[str, KeyTemplate] = {}


def register(actor: dramatiq.Actor[Any, Any]) -> None:
    """Check and record ``actor``'s fairness key (ConcurrencyKeyError at import)."""
    template = actor.options.get(OPTION)
    if template is None:
        _declared.pop(actor.actor_name, None)
        return
    if not isinstance(template, str) or not template:
        raise ConcurrencyKeyError(
            f"Actor {actor.actor_name!r}: fairness_key must be a non-empty format string, "
            f'such as "tenant:{{tenant_id}}"'
        )
    signature = checked_template(actor, OPTION, template)
    _declared[actor.actor_name] = KeyTemplate(template=template, signature=signature)


def enabled() -> bool:
    """``JOBS_FAIR_QUEUEING``: off, a send ignores fairness keys (workers still
    take turns among the jobs already in key lists)."""
    from jobs.conf import jobs_settings

    return bool(jobs_settings.JOBS_FAIR_QUEUEING)


def forget(actor_name: str) -> None:
    """Drop ``actor_name``'s fairness key (its declaration failed after all)."""
    _declared.pop(actor_name, None)


def key_of(message: dramatiq.Message[Any]) -> str:
    """The fairness key of ``message`` ("" when its actor declares none)."""
    declared = _declared.get(message.actor_name)
    if declared is None:
        return ""
    return declared.key(tuple(message.args), dict(message.kwargs))


def _base(namespace: str, queue_name: str) -> str:
    return f"{namespace}:{queue_name}:fair"


def list_key(namespace: str, queue_name: str, key: str) -> str:
    return f"{_base(namespace, queue_name)}:k:{key}"


def counts_key(namespace: str, queue_name: str) -> str:
    return _base(namespace, queue_name)


def turns_key(namespace: str, queue_name: str) -> str:
    return f"{_base(namespace, queue_name)}:turns"


def heads_key(namespace: str, queue_name: str) -> str:
    return f"{_base(namespace, queue_name)}:heads"


# Last before dispatch.lua in the enqueue script (after the marker, intake and
# wake-up prefixes, which apply to a fair message as to any): ARGV[14] is the
# key. The message goes into its key's list with Redis's time (the clock every
# host shares), the key into the turns if it had no job waiting, and
# dispatch.lua's own enqueue is turned off.
ENQUEUE_PREFIX = """
if ARGV[1] == "enqueue" and ARGV[14] and ARGV[14] ~= "" then
    local jobs_fair = KEYS[1] .. ":" .. ARGV[3] .. ":fair"
    local jobs_t = redis.call("TIME")
    local jobs_at = tonumber(jobs_t[1]) * 1000 + math.floor(tonumber(jobs_t[2]) / 1000)
    redis.call("hset", KEYS[1] .. ":" .. ARGV[3] .. ".msgs", ARGV[9], ARGV[10])
    if redis.call("rpush", jobs_fair .. ":k:" .. ARGV[14], jobs_at .. "|" .. ARGV[9]) == 1 then
        redis.call("rpush", jobs_fair .. ":turns", ARGV[14])
        redis.call("zadd", jobs_fair .. ":heads", jobs_at, ARGV[14])
    end
    redis.call("hincrby", jobs_fair, "jobs", 1)
    ARGV[1] = "enqueued-fair"
end
"""

# Before dispatch.lua in the dispatch script. A fetch of a queue with keys
# waiting takes the jobs it will hand out, alternating between the key whose
# turn it is and the queue's own list, and pushes their ids back at the head of
# the queue's list, where dispatch.lua's fetch pops exactly them: it stops at
# the prefetch or when both are empty, as this does. A purge drops the keys'
# jobs with the queue's.
FETCH_PREFIX = """
if ARGV[1] == "fetch" or ARGV[1] == "purge" then
    local jobs_queue = KEYS[1] .. ":" .. ARGV[3]
    local jobs_fair = jobs_queue .. ":fair"
    local jobs_turns = jobs_fair .. ":turns"
    local jobs_heads = jobs_fair .. ":heads"
    if ARGV[1] == "purge" then
        for _, jobs_key in ipairs(redis.call("lrange", jobs_turns, 0, -1)) do
            redis.call("del", jobs_fair .. ":k:" .. jobs_key)
        end
        redis.call("del", jobs_turns, jobs_heads, jobs_fair)
    elseif redis.call("exists", jobs_turns) == 1 then
        -- The oldest job of the key whose turn it is (nil: no key has one); the
        -- key's turn goes to the back while it has more.
        local function jobs_next_fair()
            while true do
                local key = redis.call("lpop", jobs_turns)
                if not key then
                    return nil
                end
                local own = jobs_fair .. ":k:" .. key
                local entry = redis.call("lpop", own)
                local head = redis.call("lindex", own, 0)
                if head then
                    redis.call("rpush", jobs_turns, key)
                    redis.call("zadd", jobs_heads, string.match(head, "^([^|]*)|"), key)
                else
                    redis.call("zrem", jobs_heads, key)
                end
                if entry then
                    redis.call("hincrby", jobs_fair, "jobs", -1)
                    return string.match(entry, "^[^|]*|(.*)$")
                end
            end
        end
        local jobs_want = math.min(tonumber(ARGV[9]), tonumber(ARGV[8]))
        local jobs_plain_next = redis.call("hget", jobs_fair, "plain_next") == "1"
        local jobs_taken = {}
        while #jobs_taken < jobs_want do
            local jobs_id = jobs_plain_next and redis.call("lpop", jobs_queue)
            local jobs_was_plain = jobs_id and true or false
            if not jobs_id then
                jobs_id = jobs_next_fair()
            end
            if not jobs_id and not jobs_plain_next then
                jobs_id = redis.call("lpop", jobs_queue)
                jobs_was_plain = true
            end
            if not jobs_id then
                break
            end
            jobs_taken[#jobs_taken + 1] = jobs_id
            jobs_plain_next = not jobs_was_plain
        end
        for i = #jobs_taken, 1, -1 do
            redis.call("lpush", jobs_queue, jobs_taken[i])
        end
        if redis.call("exists", jobs_turns) == 1 then
            redis.call("hset", jobs_fair, "plain_next", jobs_plain_next and "1" or "0")
        else
            redis.call("del", jobs_fair, jobs_heads)
        end
    end
end
"""

# KEYS: namespace. ARGV: queue, most entries to move. Moves up to that many jobs
# of the key whose turn is next (then the next key's) back to the tail of the
# queue's list, keeping the counts, turns and heads right; returns how many
# moved. A script blocks Redis: the caller moves a backlog a chunk at a time.
_UNWIND = """
local queue = KEYS[1] .. ":" .. ARGV[1]
local fair = queue .. ":fair"
local budget = tonumber(ARGV[2])
local moved = 0
-- Only a fair queue's counts: "<x>:fair" can also be another structure's
-- name (the slots of a key "tenant:fair" are "__slots__.tenant:fair").
if redis.call("exists", fair) == 1 and (redis.call("type", fair).ok ~= "hash"
        or redis.call("hexists", fair, "jobs") == 0) then
    return 0
end
while moved < budget do
    local key = redis.call("lindex", fair .. ":turns", 0)
    if not key then
        break
    end
    local own = fair .. ":k:" .. key
    local entries = redis.call("lrange", own, 0, budget - moved - 1)
    for _, entry in ipairs(entries) do
        redis.call("rpush", queue, string.match(entry, "^[^|]*|(.*)$"))
    end
    moved = moved + #entries
    redis.call("ltrim", own, #entries, -1)
    redis.call("hincrby", fair, "jobs", -#entries)
    local head = redis.call("lindex", own, 0)
    if head then
        redis.call("zadd", fair .. ":heads", string.match(head, "^([^|]*)|"), key)
    else
        redis.call("lpop", fair .. ":turns")
        redis.call("zrem", fair .. ":heads", key)
    end
end
if redis.call("exists", fair .. ":turns") == 0 then
    redis.call("del", fair, fair .. ":heads")
end
return moved
"""
# Jobs per unwind call: a few milliseconds of Redis each.
UNWIND_CHUNK = 1_000


def fair_queues(client: Any, namespace: str) -> list[str]:
    """The queues with fair key lists in Redis (a SCAN of the namespace), named
    or not by an actor of this release."""
    prefix, found = f"{namespace}:", set()
    for name in client.scan_iter(match=f"{prefix}*:fair", count=1_000, _type="hash"):
        queue_name = _text(name)[len(prefix) : -len(":fair")]
        # Not a key list ending in ":fair" (a colon), nor our own structures
        # for a key ending so ("__slots__.tenant:fair", also a hash).
        if queue_name and ":" not in queue_name and not queue_name.startswith("__"):
            found.add(queue_name)
    return sorted(found)


def unwind(client: Any, namespace: str, queue_name: str) -> int:
    """Move ``queue_name``'s fair jobs back into its list as plain messages,
    a key at a time in turn order (before a rollback to a release without fair
    queueing); how many moved."""
    moved = 0
    while True:
        step = int(client.eval(_UNWIND, 1, namespace, queue_name, UNWIND_CHUNK))
        moved += step
        if step < UNWIND_CHUNK:
            return moved


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
