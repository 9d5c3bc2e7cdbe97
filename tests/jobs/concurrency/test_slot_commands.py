"""What a keyed job costs Redis: the commands a fetch and a release run inside
their scripts, counted by a real redis-server (INFO commandstats). A command
run from Lua cost Redis about a microsecond beyond its own work; four a job
for the slot alone made a key's cost on a job that never waits mostly Redis's
(``python -m bench --only concurrency-key`` gives the figures)."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest

from jobs.broker import redis_broker
from jobs.concurrency import slots
from tests.jobs.concurrency.actors import QUEUE, report

pytestmark = pytest.mark.django_db(transaction=True)

# Commands besides one a job: the dispatch's own (TIME, the contact and
# heartbeat bookkeeping, the fair queue's EXISTS) and a batch's (LPOP, HMGET,
# HLEN, the key's SADD, SADD to the ack set; a release's HMGET, HDEL,
# SISMEMBER, HLEN, SREM).
_BOOKKEEPING = 10


_NOT_INSIDE = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_config", "cmdstat_script")


def _commands_inside(client: Any) -> dict[str, int]:
    """Commands Redis ran since the last reset, the script calls left out."""
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(stat["calls"])
        for name, stat in stats.items()
        # Not the script calls, nor this test's CONFIG RESETSTAT and SCRIPT LOAD
        # (subcommands: "config|resetstat" on Redis 7, "config" on 6.2).
        if name not in _NOT_INSIDE and "|" not in name
    }


def test_a_fetch_and_a_release_of_one_keys_jobs_run_a_few_commands_not_several_a_job(
    broker: dramatiq.Broker,
) -> None:
    # 16 jobs of one key whose limit they do not reach: the fetch pops them in
    # one LPOP, reads them in one HMGET, counts the key's slots once, takes
    # each with one HSETNX and notes the key among those with slots once; the
    # release reads the key's holders in one HMGET and frees them in one HDEL.
    # Before: seven commands a job in the fetch and two in the release.
    rb, jobs = redis_broker(), 16
    for _ in range(jobs):
        report.send("t", 0.0)
    client = rb.client
    client.config_resetstat()
    token = 7  # (the worker's take token for this fetch)
    reply = rb.do_fetch(QUEUE, jobs, "slots", token, report.actor_name, 100, "tenant:{tenant}")
    taken = slots.decided(reply.pop(), token)
    assert len(reply) == jobs
    assert [job.outcome for job in taken] == [slots.TAKEN] * jobs
    fetch = _commands_inside(client)
    assert fetch.get("hsetnx") == jobs, fetch
    assert fetch.get("hlen") == 1, fetch
    assert fetch.get("sadd") == 2, fetch  # the key's, once; the ack set's, once
    assert sum(fetch.values()) <= jobs + _BOOKKEEPING, fetch

    client.config_resetstat()
    # Each freed by the take that took it (its redis message id and token).
    delivery = {
        message.message_id: message.options["redis_message_id"]
        for message in map(dramatiq.Message.decode, reply)
    }
    held = [
        slots.Held(job.key, job.message_id, 100, delivery[job.message_id], token) for job in taken
    ]
    slots.release(client, rb.namespace, held, broker_id=rb.broker_id)
    release = _commands_inside(client)
    assert sum(release.values()) <= _BOOKKEEPING, release
    assert slots.holders(client, rb.namespace, "tenant:t") == {}
    assert not client.smembers(f"{rb.namespace}:{slots.SLOT_KEYS}")


def test_a_release_of_more_jobs_of_one_key_than_lua_can_unpack_frees_them_all(
    broker: dramatiq.Broker,
) -> None:
    # The release passes a key's message ids to HMGET and HDEL as arguments,
    # which Lua's stack holds up to about 8,000: a larger batch goes in groups.
    rb, jobs = redis_broker(), 9_000
    key = "tenant:many"
    client = rb.client
    client.hset(
        f"{rb.namespace}:__slots__.{key}",
        mapping={f"m{i}": f"W:{rb.broker_id}:r{i}:3" for i in range(jobs)},
    )
    client.sadd(f"{rb.namespace}:{slots.SLOT_KEYS}", key)
    held = [slots.Held(key, f"m{i}", 10_000, f"r{i}", 3) for i in range(jobs)]
    slots.release(client, rb.namespace, held, broker_id=rb.broker_id)
    assert slots.holders(client, rb.namespace, key) == {}
    assert not client.smembers(f"{rb.namespace}:{slots.SLOT_KEYS}")


def test_a_sweep_reads_each_holders_beat_once_not_once_a_slot(
    broker: dramatiq.Broker,
) -> None:
    # A shared key's slots are hundreds of one or two workers' jobs (2 x 8
    # threads, their prefetch, releases gathering for the acks). The sweep
    # read the heartbeat of each slot's holder: 300 ZSCOREs here, once a second
    # per worker. Two live workers and a dead one: one read each.
    rb = redis_broker()
    client = rb.client
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    client.zadd(f"{rb.namespace}:__heartbeats__", {"live-a": now_ms, "live-b": now_ms})
    holders: dict[Any, Any] = {
        f"job-{n}": f"W:{('live-a', 'live-b', 'dead')[n % 3]}:r{n}:1" for n in range(300)
    }
    client.hset(f"{rb.namespace}:{slots.SLOTS}tenant:big", mapping=holders)
    client.sadd(f"{rb.namespace}:{slots.SLOT_KEYS}", "tenant:big")
    client.set(f"{rb.namespace}:__contact_since__", 0)  # a contact period old enough to judge
    client.config_resetstat()
    slots.sweep(client, rb.namespace, timeout_ms=60_000, among=slots.SLOT_KEYS)
    assert _commands_inside(client).get("zscore") == 3
    # The dead worker's 100 slots freed, the live workers' 200 kept.
    left = slots.holders(client, rb.namespace, "tenant:big")
    assert len(left) == 200
    assert not any(":dead:" in holder for holder in left.values())
