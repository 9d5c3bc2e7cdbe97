"""A producer or a worker writing ledger batches in lock-step with the test.

python -m tests.jobs.ledger.ledger_batches_proc ROLE ROUNDS COUNT

Each round touches the same COUNT messages from both roles, in opposite orders:
the producer records "enqueued" for them in ascending order, the worker records
"running" (odd numbers) or "running" then "succeeded" (even numbers) in
descending order, so the worker's batch has two shapes, interleaved. Both go
through the shipped batch writer (``record`` then ``flush``). The test sends
"go START_AT" per round on stdin so the two batches of a round overlap; the process
answers "done", and at the end prints its ledger write failures and the
batches it had to write again (after a deadlock).
"""

from __future__ import annotations

import sys
import time

import django


def main() -> None:
    django.setup()
    from datetime import UTC, datetime

    from jobs.ledger import writer as ledger
    from jobs.ledger.writer import PHASE_ENQUEUED, PHASE_RUNNING, TERMINAL, Event, progress_of

    role, rounds, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    now = datetime.now(UTC)
    create = {"actor_name": "batches", "queue_name": "batches", "enqueued_at": now}
    print("ready", flush=True)
    for round_ in range(rounds):
        command, _, start_at = sys.stdin.readline().partition(" ")
        if command != "go":
            return
        # Both processes start the round at the same instant, not as each wakes up.
        time.sleep(max(0.0, float(start_at) - time.time()))
        ids = [f"b-{round_:03d}-{n:04d}" for n in range(count)]
        if role == "producer":
            for message_id in ids:
                enqueued = progress_of(0, PHASE_ENQUEUED)
                update = {"redis_message_id": "r"}
                ledger.record(Event(message_id, "enqueued", enqueued, dict(create), update))
        else:
            for n, message_id in reversed(list(enumerate(ids))):
                running = {"attempts": 1, "started_at": now, "worker_pid": 1}
                ledger.record(
                    Event(message_id, "running", progress_of(0, PHASE_RUNNING), create, running)
                )
                if n % 2 == 0:
                    done = {"finished_at": now, "duration_ms": 1}
                    ledger.record(Event(message_id, "succeeded", TERMINAL, dict(create), done))
        ledger.flush()
        print("done", flush=True)
    print(f"failures {ledger.stats.write_failures} retries {ledger.stats.retries}", flush=True)


if __name__ == "__main__":
    main()
