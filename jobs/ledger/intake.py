"""First sends reach the ledger through Redis, in the same command as the message.

Building a job's "enqueued" event and writing it from the sending process was
three quarters of what the full stack added to ``actor.send()`` (issue 17's
profile: ~75 of ~100 us), paid by every web request that sends a job. So the
broker's enqueue script also pushes ``<queue>\\n<redis message id>`` onto
``<ns>:ledger.intake``: one more list push inside the same atomic command, so
the entry exists exactly when the message does, whoever sent it and however
the sender dies afterwards. The rows are written from there by whoever needs
them first:

- every worker process, each ``JOBS_LEDGER_FLUSH_MS`` (``Drainer``; one process
  at a time holds the drain lock);
- a reader that must see every job now: the admin's job pages, a task's
  ``get_result()``, ``jobs.ledger.writer.flush()`` (``catch_up``).

An entry leaves the list only once its rows are committed, by a trim that
checks the drainer still holds the lock; a drainer killed mid-batch leaves its
entries to the next one (the writes are idempotent upserts). An entry whose
message Redis no longer holds is dropped: the job already ran (or was
cancelled), and the worker's own events carried its row.

Only first sends take this way (``is_first_send``): a retry, a deferral and a
paused queue's put-back are recorded by the worker that enqueues them, before
its ack, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from uuid import uuid4

import dramatiq
from django.db import connection
from dramatiq.common import q_name

from jobs.conf import jobs_settings
from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable
from jobs.ledger import writer
from jobs.ledger.writer import DatabaseUnreachable, Event
from jobs.middleware.control import PAUSE_REQUEUES

logger = logging.getLogger(__name__)

# Entries per batch: one LRANGE, one HMGET per queue, one transaction.
BATCH = 500
# A drainer that dies holding the lock holds up the intake this long.
LOCK_MS = 10_000
# After Redis failed a reader's catch-up, readers do not ask again for this
# long: an admin page while Redis is away costs one probe, not one per page.
READER_BACKOFF_S = 5.0

# KEYS: intake, lock, set of actors with kept entries; ARGV: token, entries
# taken, then actor and entry of each to keep. Trims only for the lock's holder
# (one whose lock expired mid-batch leaves the trim to its successor, which read
# the same entries). An entry of an actor this process does not know goes to
# that actor's list beside the intake (``<intake>.actor.<name>``), where only a
# process that knows the actor looks (``_ADOPT``): pushed back onto the intake,
# it was read and decoded again at every drain of every older process, for as
# long as a rolling deploy lasted.
_TRIM = f"""
if redis.call("get", KEYS[2]) ~= ARGV[1] then return 0 end
redis.call("ltrim", KEYS[1], ARGV[2], -1)
for i = 3, #ARGV, 2 do
    redis.call("rpush", KEYS[1] .. ".actor." .. ARGV[i], ARGV[i + 1])
    redis.call("sadd", KEYS[3], ARGV[i])
end
redis.call("pexpire", KEYS[2], {LOCK_MS})
return 1
"""
# KEYS: intake, set of actors with kept entries; ARGV: actors this process
# knows. Moves their kept entries back onto the intake; returns how many.
# Lua: push every element of a table onto a list, a thousand per RPUSH
# (unpack's stack limit).
_PUSH_ALL = """
local function push_all(list, entries)
    for first = 1, #entries, 1000 do
        redis.call("rpush", list, unpack(entries, first, math.min(first + 999, #entries)))
    end
end
"""
_ADOPT = (
    _PUSH_ALL
    + """
local moved = 0
for i = 1, #ARGV do
    local kept = KEYS[1] .. ".actor." .. ARGV[i]
    local entries = redis.call("lrange", kept, 0, -1)
    push_all(KEYS[1], entries)
    moved = moved + #entries
    redis.call("del", kept)
    redis.call("srem", KEYS[2], ARGV[i])
end
return moved
"""
)
_RELEASE = """
if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end
return 0
"""


def intake_key(namespace: str) -> str:
    return f"{namespace}:ledger.intake"


def _kept_actors_key(namespace: str) -> str:
    return f"{intake_key(namespace)}.actors"


def _kept_key(namespace: str, actor: str | bytes) -> str:
    """The list of entries kept for ``actor`` (``_TRIM`` builds the same name)."""
    name = actor.decode() if isinstance(actor, bytes) else actor
    return f"{intake_key(namespace)}.actor.{name}"


# KEYS: intake, set of actors with kept entries; ARGV: namespace. Drops the
# kept entries whose message Redis no longer holds (it ran, or was put back as
# a new copy with its own entry): a list no process knowing its actor reads
# (the actor removed, a rollback) would otherwise only grow.
_PRUNE_KEPT = (
    _PUSH_ALL
    + """
local dropped = 0
for _, name in ipairs(redis.call("smembers", KEYS[2])) do
    local kept = KEYS[1] .. ".actor." .. name
    local live = {}
    for _, entry in ipairs(redis.call("lrange", kept, 0, -1)) do
        local queue, redis_id = string.match(entry, "^([^\\n]*)\\n(.*)$")
        if queue and redis.call("hexists", ARGV[1] .. ":" .. queue .. ".msgs", redis_id) == 1 then
            live[#live + 1] = entry
        else
            dropped = dropped + 1
        end
    end
    redis.call("del", kept)
    push_all(kept, live)
    if #live == 0 then
        redis.call("srem", KEYS[2], name)
    end
end
return dropped
"""
)
# Seconds between a drainer's prunes of the kept entries.
PRUNE_KEPT_INTERVAL = 60.0


def prune_kept(broker: Any) -> int:
    """Drop kept entries whose message is gone (``_PRUNE_KEPT``); how many."""
    key = intake_key(broker.namespace)
    return int(
        broker.client.eval(
            _PRUNE_KEPT, 2, key, _kept_actors_key(broker.namespace), broker.namespace
        )
    )


def _present(broker: Any) -> int:
    """The intake's length, once the entries kept for actors this process
    knows are back on it: one round trip when none are kept."""
    client, key = broker.client, intake_key(broker.namespace)
    kept = _kept_actors_key(broker.namespace)
    pipe = client.pipeline(transaction=False)
    pipe.llen(key)
    pipe.smembers(kept)
    present, actors = pipe.execute()
    known = sorted(name for name in (a.decode() for a in actors) if name in broker.actors)
    if known:
        present = int(present) + int(client.eval(_ADOPT, 2, key, kept, *known))
    return int(present)


def waiting(broker: Any) -> int:
    """Entries not written yet: on the intake, and kept for actors that the
    process which read them did not know (for the metrics)."""
    client, key = broker.client, intake_key(broker.namespace)
    actors = sorted(a.decode() for a in client.smembers(_kept_actors_key(broker.namespace)))
    pipe = client.pipeline(transaction=False)
    pipe.llen(key)
    for name in actors:
        pipe.llen(_kept_key(broker.namespace, name))
    return sum(int(n) for n in pipe.execute())


def is_first_send(message: dramatiq.Message[Any]) -> bool:
    """Whether ``message`` is being sent for the first time (not a retry, a
    deferral or a paused queue's put-back, which all set ``retries``)."""
    options = message.options
    return options.get("retries") is None and PAUSE_REQUEUES not in options


def _events(broker: Any, entries: list[bytes]) -> tuple[list[Event], list[str | bytes]]:
    """The events of ``entries``, and the entries to keep for another process
    (actor, entry, ...): those of an actor this one does not know (a rolling
    deploy's new actor), whose arguments it could not redact by parameter name."""
    from jobs.middleware.ledger import enqueue_event  # the middleware builds the event

    by_queue: dict[str, list[bytes]] = {}
    for entry in entries:
        by_queue.setdefault(entry.decode().partition("\n")[0], []).append(entry)
    pipe = broker.client.pipeline(transaction=False)
    for queue_name, queued in by_queue.items():
        ids = [entry.decode().partition("\n")[2] for entry in queued]
        pipe.hmget(f"{broker.namespace}:{queue_name}.msgs", ids)
    events: list[Event] = []
    kept: list[str | bytes] = []
    for (queue_name, queued), found in zip(by_queue.items(), pipe.execute(), strict=True):
        delayed = queue_name != q_name(queue_name)
        for entry, data in zip(queued, found, strict=True):
            if data is None:  # ran (or cancelled) already: its row came with it
                continue
            try:
                message = dramatiq.Message.decode(data)
                if message.actor_name not in broker.actors:
                    # A name that is not text (a foreign sender's) would fail
                    # the whole trim, every drain: dropped as undecodable.
                    message.actor_name.encode()
                    kept += [message.actor_name, entry]
                    continue
                events.append(enqueue_event(broker, message, delayed=delayed))
            except Exception:
                # Never the whole batch for one message: its row comes when it runs.
                logger.exception("Job ledger intake: could not record a queued message")
    return events, kept


# How many intake entries a peek reads: the intake is drained within a flush
# interval, so a message sent moments ago is near its head.
PEEK_LIMIT = 1_000


def peek(message_id: str, broker: Any = None) -> dramatiq.Message[Any] | None:
    """The message ``message_id`` if it waits in the intake, read from Redis only.

    For a reader that cannot drain (inside a transaction: the rows would be
    rolled back with it) and must still see a job sent moments ago. None when
    it is not there (drained already, or past ``PEEK_LIMIT``) or Redis does
    not answer.
    """
    broker = broker if broker is not None else dramatiq.get_broker()
    if not getattr(broker, "ledger_intake", False) or recently_unreachable():
        return None
    try:
        # The intake, then the entries kept aside for other processes: read
        # only (a reader may be any process, and Redis may refuse writes).
        key = intake_key(broker.namespace)
        actors = broker.client.smembers(_kept_actors_key(broker.namespace))
        pipe = broker.client.pipeline(transaction=False)
        for list_key in [key, *(_kept_key(broker.namespace, name) for name in actors)]:
            pipe.lrange(list_key, 0, PEEK_LIMIT - 1)
        entries = [entry for listed in pipe.execute() for entry in listed]
        by_queue: dict[str, list[str]] = {}
        for entry in entries:
            queue_name, _, redis_id = entry.decode().partition("\n")
            by_queue.setdefault(queue_name, []).append(redis_id)
        pipe = broker.client.pipeline(transaction=False)
        for queue_name, ids in by_queue.items():
            pipe.hmget(f"{broker.namespace}:{queue_name}.msgs", ids)
        replies = pipe.execute() if by_queue else []
    except UNREACHABLE as exc:
        note_unreachable(exc)
        return None
    needle = message_id.encode()
    for found in replies:
        for data in found:
            if data is not None and needle in data:  # cheap before decoding
                message = dramatiq.Message.decode(data)
                if message.message_id == message_id:
                    return message
    return None


def drain(broker: Any, *, deadline: float | None = None) -> bool | None:
    """Write the entries the intake holds now to the database.

    True when done; False when ``deadline`` (monotonic, checked after each
    batch) passed with some left, so call again; None when it could not drain
    now: another process is draining, the database is unreachable, or the
    caller is inside a transaction (its rows would be rolled back with it
    after their entries were trimmed).
    """
    if connection.in_atomic_block:
        return None
    client = broker.client
    key, lock = intake_key(broker.namespace), intake_key(broker.namespace) + ".lock"
    present = _present(broker)
    if not present:  # the usual case, and no write to Redis for it
        return True
    token = uuid4().hex
    if not client.set(lock, token, nx=True, px=LOCK_MS):
        return None
    try:
        # Those present now: entries sent meanwhile are for the next call.
        while present > 0:
            entries = client.lrange(key, 0, min(BATCH, present) - 1)
            if not entries:
                return True
            events, kept = _events(broker, entries)
            if events:
                writer.write_now(events)
            kept_actors = _kept_actors_key(broker.namespace)
            if not client.eval(_TRIM, 3, key, lock, kept_actors, token, len(entries), *kept):
                return None
            present -= len(entries)
            if present > 0 and deadline is not None and time.monotonic() > deadline:
                return False
        return True
    except DatabaseUnreachable as exc:
        logger.warning("Job ledger intake: database unreachable, entries kept: %s", exc)
        return None
    finally:
        client.eval(_RELEASE, 1, lock, token)


_reader_backoff_until = 0.0


def catch_up(broker: Any = None, timeout: float = 2.0) -> bool:
    """Have every job sent so far in the database (for a reader that must see
    them now): drain, or wait for the process draining. False when that was
    not done within ``timeout`` seconds (a long backlog, an unreachable
    database or Redis, a caller inside a transaction); never raises.

    Redis is first asked from a helper thread waited for at most ``timeout``,
    so a stalled server costs the reader that long, not the client's connect
    and socket timeouts; after a failure, readers skip the intake for
    ``READER_BACKOFF_S``.
    """
    global _reader_backoff_until
    if not jobs_settings.JOBS_LEDGER_ENABLED:
        return True
    broker = broker if broker is not None else dramatiq.get_broker()
    if not getattr(broker, "ledger_intake", False):
        return True
    now = time.monotonic()
    if now < _reader_backoff_until or connection.in_atomic_block or recently_unreachable():
        return False
    deadline = now + timeout
    try:
        if not _waiting(broker, timeout):
            return True
        while True:
            if drain(broker, deadline=deadline):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
    except Exception as exc:
        _reader_backoff_until = time.monotonic() + READER_BACKOFF_S
        if isinstance(exc, UNREACHABLE):
            note_unreachable(exc)
        logger.warning("Job ledger intake not read (Redis unreachable?)", exc_info=True)
        return False


def _waiting(broker: Any, timeout: float) -> int:
    """The intake's length, asked from a thread waited for at most ``timeout``
    (which goes on alone, until the client's own timeouts, if Redis stalls)."""
    answer: list[Any] = []

    def ask() -> None:
        try:
            answer.append(_present(broker))
        except Exception as exc:
            answer.append(exc)

    thread = threading.Thread(target=ask, name="job-ledger-intake-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if not answer:
        raise TimeoutError(f"Redis did not answer within {timeout:.1f} s")
    if isinstance(answer[0], Exception):
        raise answer[0]
    return int(answer[0])


class Drainer:
    """A worker process's thread that moves the intake into the database."""

    # Between drains when JOBS_LEDGER_FLUSH_MS is 0 (nothing is sent this way then)
    IDLE_INTERVAL = 0.2

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="job-ledger-intake", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        next_prune = time.monotonic() + PRUNE_KEPT_INTERVAL
        while True:
            # As often as the process's own batches (read each time: tests change it).
            interval = jobs_settings.JOBS_LEDGER_FLUSH_MS / 1000 or self.IDLE_INTERVAL
            if self.stopping.wait(interval * (1 + min(failures, 20))):
                return
            try:
                # A pass at a time, releasing the lock between passes: a reader
                # (an admin page) gets its turn during a long backlog.
                while drain(self.broker, deadline=time.monotonic() + interval) is False:
                    if self.stopping.wait(0.01):
                        return
                if time.monotonic() >= next_prune:
                    next_prune = time.monotonic() + PRUNE_KEPT_INTERVAL
                    prune_kept(self.broker)
                failures = 0
            except Exception:
                failures += 1
                logger.warning("Job ledger intake not drained; trying again", exc_info=True)
            finally:
                # A pass that wrote opened a connection; none is kept between
                # passes (no idle backend per quiet worker, none left open into
                # a test database's teardown).
                connection.close()
