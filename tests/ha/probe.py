"""The app's Redis users, exercised from a process configured like production.

    python -m tests.ha.probe once           # one round; prints {"ok": true, ...}
    python -m tests.ha.probe loop SECONDS   # a round every 50 ms; one JSON line each
    python -m tests.ha.probe wait-cost N    # enqueue latency with and without WAIT 1
    python -m tests.ha.probe outbox-send    # commit one outbox row; prints its state
    python -m tests.ha.probe outbox-relay ID  # one relay pass over row ID; prints its state

Run with ``DJANGO_SETTINGS_MODULE=tests.worker_settings`` and the Sentinel
variables: every round uses the same long-lived client objects (the broker's,
the cache's), so a failover shows whether they find the new primary by
themselves.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any


def one_round(n: int) -> None:
    from django.core.cache import cache

    from jobs.broker import redis_broker
    from jobs.consistency.cache import cached
    from jobs.consistency.locks import redis_lock
    from jobs.scheduling.scheduler import claim_tick

    cache.set(f"probe:{n}", n, 60)
    if cache.get(f"probe:{n}") != n:
        raise AssertionError("cache read back a different value")
    if cached("probe", str(n), lambda: n, ttl=60) != n:
        raise AssertionError("cached() returned a different value")
    with redis_lock("probe", ttl=5, wait=2) as lock:
        lock.check()
        if lock.fencing_token <= 0:  # issued by a script on the primary (its fence key)
            raise AssertionError("no fencing token")
    if not claim_tick("probe", datetime.fromtimestamp(n / 1000, tz=UTC)):
        raise AssertionError("a fresh tick was already claimed")
    redis_broker().client.ping()


def loop(seconds: float) -> None:
    n = int(time.time() * 1000)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        n += 1
        started = time.time()
        try:
            one_round(n)
            line: dict[str, Any] = {"at": started, "ok": True}
        except Exception as exc:
            line = {"at": started, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
        line["took"] = time.time() - started
        print(json.dumps(line), flush=True)
        time.sleep(0.05)


def wait_cost(count: int) -> None:
    from jobs.broker import redis_broker
    from jobs.broker.replication import confirmed_by_replicas
    from jobs.broker.wakeup import WakeupRedisBroker

    broker = redis_broker()
    assert isinstance(broker, WakeupRedisBroker)
    data = b"x" * 300  # about a welcome email's message
    result = {}
    for replicas in (0, 1, 0, 1):  # interleaved, so drift hits both alike
        took = []
        for _ in range(count):
            started = time.perf_counter()
            with confirmed_by_replicas(replicas, 500):
                broker.do_enqueue("probe-cost", str(uuid.uuid4()), data)
            took.append(time.perf_counter() - started)
        took.sort()
        result[f"wait{replicas}"] = {
            "p50_ms": took[len(took) // 2] * 1000,
            "p99_ms": took[int(len(took) * 0.99)] * 1000,
            "per_s": count / sum(took),
        }
    print(json.dumps(result), flush=True)


def outbox_state(row_id: int) -> dict[str, Any]:
    from jobs.models import OutboxMessage

    row = OutboxMessage.objects.get(pk=row_id)
    return {
        "id": row.pk,
        "message_id": row.message_id,
        "sent": row.sent_at is not None,
        "attempts": row.attempts,
        "last_error": row.last_error,
    }


def outbox_send() -> None:
    from django.db import transaction

    from jobs.consistency.outbox import send_on_commit
    from tests.examples.tasks import demo_pipeline

    with transaction.atomic():
        row = send_on_commit(demo_pipeline, "failover")
    print(json.dumps(outbox_state(row.pk)), flush=True)


def outbox_relay(row_id: int) -> None:
    from jobs.consistency.outbox import publish
    from jobs.models import OutboxMessage

    OutboxMessage.objects.filter(pk=row_id).update(claimed_until=None)  # skip the backoff
    publish([row_id])
    print(json.dumps(outbox_state(row_id)), flush=True)


def main(argv: list[str]) -> None:
    import django

    django.setup()
    if argv[0] == "once":
        one_round(int(time.time() * 1000))
        print(json.dumps({"ok": True}), flush=True)
    elif argv[0] == "loop":
        loop(float(argv[1]))
    elif argv[0] == "wait-cost":
        wait_cost(int(argv[1]))
    elif argv[0] == "outbox-send":
        outbox_send()
    elif argv[0] == "outbox-relay":
        outbox_relay(int(argv[1]))
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
