"""The pulse beats for a worker only under the broker id its own run wrote.

A container restarted within the presence key's TTL (30 s) has the same
hostname and, in a new pid namespace, the same pids: the old run's key still
names the old, dead broker id when the new pulse first looks. Beating for it
would keep the dead worker "alive" (its unacked messages never redelivered)
and leave the new worker unbeaten through a GIL-holding job.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import dramatiq
import pytest

from jobs.broker import pulse, redis_broker
from jobs.broker.workers import PREFIX, presence_value, process_start


@pytest.fixture
def sibling() -> Iterator[int]:
    """A live child of this process: the pulse's view of a worker process."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


def test_a_key_left_by_an_earlier_run_of_the_same_pid_is_not_beaten_for(
    broker: dramatiq.Broker, sibling: int
) -> None:
    client = redis_broker().client
    host = socket.gethostname()
    key = f"{PREFIX}{host}:{sibling}"
    started = process_start(sibling)
    assert started is not None
    # Given the previous run's key: same host and pid, another start
    client.set(key, presence_value("dead-broker-id", str(int(started) - 500)), ex=30)

    # When the pulse looks for its workers
    found = pulse._workers(client, host, pulse.live_siblings(os.getpid()), {})

    # Then it beats for nobody yet
    assert found == {}

    # And once the worker's own run writes its key, it beats for that one
    client.set(key, presence_value("live-broker-id", started), ex=30)
    found = pulse._workers(client, host, pulse.live_siblings(os.getpid()), {})
    assert found == {(sibling, started): "live-broker-id"}
    client.delete(key)


def test_a_key_without_a_start_is_from_an_earlier_run_and_is_not_taken(
    broker: dramatiq.Broker, sibling: int
) -> None:
    # The version before wrote the broker id alone: after the deploy that ships
    # this, such a key can only be the old run's (a pulse and its workers are
    # one rundramatiq, one version), and the new worker writes its own at once.
    client = redis_broker().client
    host = socket.gethostname()
    key = f"{PREFIX}{host}:{sibling}"
    client.set(key, "older-broker-id", ex=30)

    found = pulse._workers(client, host, pulse.live_siblings(os.getpid()), {})

    assert found == {}
    client.delete(key)
