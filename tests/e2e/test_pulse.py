"""The pulse (jobs.broker.pulse) beats for its rundramatiq's live workers only,
and for as long as they run, a stop included.

Real ``rundramatiq`` processes, a 2 s heartbeat timeout so that a 14 s job that
holds the GIL outlasts it many times over in a test of seconds. Run with -s for
the figures.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from jobs.broker import pulse, queues, redis_broker, workers
from tests.e2e.conftest import WorkerProcess
from tests.e2e.test_crash_safety import wait_until
from tests.examples.tasks import long_job

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_row("sqlite", "the pulse and the heartbeats live in Redis"),
]
READY = "Worker process is ready for action."
ENV = {"JOBS_HEARTBEAT_TIMEOUT_MS": "2000"}  # as the busy-worker test in test_crash_safety


def counter(key: str) -> int:
    return int(redis_broker().client.get(key) or 0)


def worker_broker_ids(worker: WorkerProcess) -> dict[int, str]:
    """pid -> broker id of a rundramatiq's worker processes (not its main, not the pulse)."""
    client: Any = redis_broker().client
    host = workers._key().removeprefix(workers.PREFIX).rsplit(":", 1)[0]
    found = {}
    for pid in worker.group_pids():
        broker_id, _started = workers.read_presence(client.get(f"{workers.PREFIX}{host}:{pid}"))
        if broker_id and pid != worker.process.pid:
            found[pid] = broker_id
    return found


def holder_and_others(worker: WorkerProcess, redis_message_id: str) -> tuple[int, list[int]]:
    """(pid of the worker process holding the message, pids of its other workers)."""
    client: Any = redis_broker().client
    namespace = redis_broker().namespace
    holder, others = None, []
    for pid, broker_id in worker_broker_ids(worker).items():
        if client.sismember(f"{namespace}:__acks__.{broker_id}.long", redis_message_id):
            holder = pid
        else:
            others.append(pid)
    assert holder is not None
    return holder, others


# "none" is the control: without a stop the pulse keeps the busy worker alive.
@pytest.mark.parametrize("stop", ["none", "sigterm-group", "sigkill-one-sibling"])
def test_it_runs_a_gil_holding_job_once_while_its_rundramatiq_stops(
    start_worker: Any, stop: str
) -> None:
    # Given a rundramatiq (2 processes, 1 thread each) running a 14 s job that
    # holds the GIL, and an idle peer that would take over a dead worker's messages
    busy = start_worker(env=ENV, processes=2, threads=1, queues=("long",))
    busy.wait_for_log(READY)
    time.sleep(1)  # both processes up, the pulse started
    message = long_job.send(f"gil-{stop}", 14, True)
    wait_until(lambda: counter(f"long-job:gil-{stop}:starts") == 1, timeout=10)
    _holder, others = holder_and_others(busy, message.options["redis_message_id"])
    peer = start_worker(env=ENV, threads=1, queues=("long",))
    peer.wait_for_log(READY)

    # When the busy rundramatiq is asked to stop (a deploy), or its other worker
    # process dies (the OOM killer picks it): either way its main process sends
    # SIGTERM to every child, the pulse included
    if stop == "sigterm-group":
        busy.process.send_signal(signal.SIGTERM)
    elif stop == "sigkill-one-sibling":
        os.kill(others[0], signal.SIGKILL)

    def ended() -> bool:
        queues.force_maintenance()
        return counter(f"long-job:gil-{stop}:ends") >= 1

    wait_until(ended, timeout=40, every=0.5)
    time.sleep(2)  # a second run would start ~2 s (the heartbeat timeout) after the stop
    starts = counter(f"long-job:gil-{stop}:starts")
    print(f"\n{stop}: the GIL-holding job started {starts} time(s)")
    # Then it ran once: a live worker was not taken for dead
    assert starts == 1
    if stop != "none":
        # And the stop still ends: the pulse does not outlive its workers
        busy.process.wait(timeout=15)
        assert busy.group_pids() == []


def test_it_stops_beating_a_killed_worker_at_once(start_worker: Any) -> None:
    client: Any = redis_broker().client
    # Given a rundramatiq with two worker processes, both beaten by the pulse
    busy = start_worker(env=ENV, processes=2, threads=1)
    busy.wait_for_log(READY)
    wait_until(lambda: len(worker_broker_ids(busy)) == 2, timeout=30)
    siblings = worker_broker_ids(busy)

    # When one of them (not the group) is SIGKILLed
    victim, broker_id = next(iter(siblings.items()))
    os.kill(victim, signal.SIGKILL)
    # Dead once the kernel says so (a killed process runs on until it is scheduled)
    wait_until(lambda: (pulse.proc_stat(victim) or ("X",))[0] in "ZX", timeout=10, every=0.005)
    killed_ms = time.time() * 1000

    # Then its broker heartbeat is not refreshed after the kill (the pulse sees
    # it gone or a zombie), so its messages go back after the heartbeat timeout
    last = 0.0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # the latest beat seen (maintenance may bury it)
        last = max(last, client.zscore(workers.heartbeats_key(), broker_id) or 0.0)
        time.sleep(0.02)
    print(f"\nlast beat of the killed worker: {last - killed_ms:.0f} ms after the kill")
    # A beat already on its way at most. A pulse that still beat for it would
    # beat every 0.4 s (a fifth of the 2 s timeout) until the end, 3 s on:
    # 1 s apart from both, so a loaded machine's scheduling does not decide.
    assert last - killed_ms < 1000
