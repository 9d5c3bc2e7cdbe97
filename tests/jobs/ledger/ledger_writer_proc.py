"""Writes ledger events for many messages, for the cross-process race test.

python -m tests.jobs.ledger.ledger_writer_proc SEED COUNT
"""

from __future__ import annotations

import random
import sys

import django


def main() -> None:
    django.setup()
    from datetime import UTC, datetime

    from jobs.ledger import writer as ledger
    from jobs.ledger.writer import PHASE_ENQUEUED, PHASE_RUNNING, TERMINAL, Event, progress_of

    seed, count = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    create = {
        "actor_name": "race",
        "queue_name": "race",
        "enqueued_at": datetime.now(UTC),
        "args": [],
        "kwargs": {},
    }
    events = []
    for n in range(count):
        message_id = f"race-{n:05d}"
        events += [
            Event(message_id, "enqueued", progress_of(0, PHASE_ENQUEUED), create),
            Event(message_id, "running", progress_of(0, PHASE_RUNNING), create, {"attempts": 1}),
            Event(message_id, "succeeded", TERMINAL, create, {"duration_ms": 1}),
        ]
    rng.shuffle(events)
    for event in events:
        ledger.write([event])  # raises on any failure: the test wants to see it
    print("ok", len(events))


if __name__ == "__main__":
    main()
