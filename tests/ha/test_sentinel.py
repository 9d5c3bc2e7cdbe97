"""Redis Sentinel with real processes: a primary, a replica, three Sentinels.

App processes (a probe, gunicorn, rundramatiq) get ``REDIS_SENTINELS`` and a
``REDIS_URL`` whose port has no server, so anything that bypassed Sentinel
would fail. The primary is SIGKILLed; figures are printed (run with -s).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from dramatiq import Message

from jobs.ledger import states
from jobs.models import Job
from tests.e2e.conftest import ROOT
from tests.e2e.test_crash_safety import READY, signup
from tests.fault_matrix import FaultRow, report
from tests.ha.cluster import SentinelCluster

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def probe(cluster: SentinelCluster, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.ha.probe", *args],
        cwd=ROOT,
        env={**env, **cluster.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def deliveries(mail_dir: Path) -> list[tuple[str, float]]:
    """(recipient, time written) of every message the file mail backend wrote."""
    found = []
    for path in mail_dir.glob("*.log"):
        written = path.stat().st_mtime
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("To: "):
                found.append((line[len("To: ") :], written))
    return found


def test_it_reaches_the_primary_through_sentinel_for_cache_locks_ticks_and_broker(
    sentinel_cluster: SentinelCluster, worker_env: dict[str, str]
) -> None:
    # Given an app process that knows only the Sentinels (REDIS_URL points nowhere)
    # When it uses the cache, cached(), a lock, a scheduler tick claim and the broker
    process = probe(sentinel_cluster, worker_env, "once")
    _out, err = process.communicate(timeout=60)

    # Then it worked, and the keys are on the primary (cache db 1, broker db 0)
    assert process.returncode == 0, err
    primary = sentinel_cluster.primary.port
    cache_keys = {k.decode() for k in sentinel_cluster.client(primary, 1).keys("*")}
    broker_keys = {k.decode() for k in sentinel_cluster.client(primary, 0).keys("*")}
    assert any(k.startswith("app:1:probe:") for k in cache_keys), cache_keys
    assert "lock:probe:fence" in cache_keys
    assert any(k.startswith("jobs:tick:probe:") for k in broker_keys), broker_keys


@pytest.mark.one_row("postgresql", "a broker-side fault (failover)")
def test_it_follows_a_failover_with_the_same_clients_within_seconds(
    sentinel_cluster: SentinelCluster, worker_env: dict[str, str]
) -> None:
    # Given a process doing a round of cache, lock, tick and broker calls every 50 ms
    process = probe(sentinel_cluster, worker_env, "loop", "14")
    time.sleep(4)

    # When the primary is SIGKILLed
    killed_at = time.time()
    sentinel_cluster.kill_primary()
    out, err = process.communicate(timeout=60)
    rounds = [json.loads(line) for line in out.splitlines()]

    # Then Sentinel promoted the replica and the same client objects work again
    after = [r for r in rounds if r["at"] > killed_at]
    failed = [r for r in after if not r["ok"]]
    # A round that starts just after kill_primary() returns can still finish on the
    # old primary before its socket notices; recovery starts at the first failure.
    first_failure = next((i for i, r in enumerate(after) if not r["ok"]), len(after))
    first_ok = next((r for r in after[first_failure:] if r["ok"]), None)
    assert first_ok is not None, f"never recovered: {failed[-3:]} {err[-2000:]}"
    recovery = first_ok["at"] + first_ok["took"] - killed_at
    print(
        f"\nfailover: {len(failed)} of {len(after)} rounds failed, clients back after "
        f"{recovery:.2f} s, slowest round {max(r['took'] for r in rounds):.2f} s"
    )
    assert sentinel_cluster.master_port() == sentinel_cluster.replica.port
    # down-after 1 s + election + promotion; 10 s leaves room for a loaded machine
    assert recovery < 10
    recovered = after[after.index(first_ok) :]
    assert all(r["ok"] for r in recovered), [r for r in recovered if not r["ok"]][:3]
    assert rounds[0]["ok"], "the probe never worked before the failover"


def test_it_measures_what_waiting_for_a_replica_costs_an_enqueue(
    sentinel_cluster: SentinelCluster, worker_env: dict[str, str]
) -> None:
    # Given the broker through Sentinel, with a replica attached
    # When 500 enqueues run without and with WAIT 1 (interleaved)
    process = probe(sentinel_cluster, worker_env, "wait-cost", "500")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    cost = json.loads(out)

    # Then WAIT costs a replication round trip, not a timeout
    print(f"\nenqueue without / with WAIT 1: {cost['wait0']} / {cost['wait1']}")
    assert cost["wait1"]["p50_ms"] < 50, "WAIT 1 timed out: the replica never acknowledged"


def test_it_sends_an_outbox_message_again_when_a_failover_lost_it(
    sentinel_cluster: SentinelCluster, worker_env: dict[str, str]
) -> None:
    # Given a replica far behind its primary: it hangs, and 48 MB of writes wait
    # for it, more than the sockets between them hold, so whatever the primary
    # takes next stays in the primary's memory
    cluster = sentinel_cluster
    old_primary = cluster.client(cluster.primary.port)
    new_primary = cluster.client(cluster.replica.port)
    cluster.replica.process.send_signal(signal.SIGSTOP)
    try:
        old_primary.set("backlog", b"x" * BACKLOG_BYTES)
        # When an app process commits an outbox row through Sentinel (no replica
        # confirms its message: the row stays pending) and the primary dies
        row = run_probe(cluster, worker_env, "outbox-send")
        assert not row["sent"], row
        assert old_primary.hlen(QUEUE_MSGS) == 1
        cluster.kill_primary()
    finally:
        cluster.replica.process.send_signal(signal.SIGCONT)
    # and Sentinel promotes the replica, which never got the message
    cluster.wait_until_sentinels_agree(cluster.replica.port, timeout=60)
    assert new_primary.hlen(QUEUE_MSGS) == 0, "the failover kept the message: no loss shown"

    # Then the relay sends it again to the new primary, once, however often it comes back
    for _ in range(3):
        row = run_probe(cluster, worker_env, "outbox-relay", str(row["id"]))
    held = [Message.decode(raw).message_id for raw in new_primary.hvals(QUEUE_MSGS)]
    assert held == [row["message_id"]], row
    assert new_primary.llen("dramatiq:default") == 1
    assert not row["sent"], "no replica holds it yet: the row must stay pending"


QUEUE_MSGS = "dramatiq:default.msgs"
# Loopback sockets buffer up to 4 MB sent + what the frozen reader's window had grown to.
BACKLOG_BYTES = 48 * 1024 * 1024


def run_probe(cluster: SentinelCluster, env: dict[str, str], *args: str) -> dict[str, Any]:
    process = probe(cluster, env, *args)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-3000:]
    reply: dict[str, Any] = json.loads(out.splitlines()[-1])
    return reply


SIGNUP_SECONDS = 20
KILL_AFTER_S = 6
SIGNUPS_PER_S = 8


FAULTS = {
    "kill": "the Redis primary SIGKILLed (Sentinel failover)",
    "stall": "the Redis primary stalled (SIGSTOP) until failed over, then back",
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "fault",
    [
        # Broker-side faults: one row each.
        pytest.param("kill", marks=pytest.mark.one_row("sqlite", "a broker-side fault")),
        pytest.param("stall", marks=pytest.mark.one_row("postgresql", "a broker-side fault")),
    ],
)
def test_it_loses_no_welcome_email_when_the_primary_fails_under_signup_load(
    sentinel_cluster: SentinelCluster,
    start_web: Any,
    start_worker: Any,
    worker_env: dict[str, str],
    fault: str,
) -> None:
    mail_dir = Path(worker_env["EMAIL_FILE_PATH"])
    # The mail provider budget (10/s shipped) would delay emails on its own and
    # blur the recovery time this test measures.
    env = {**sentinel_cluster.env, "WELCOME_EMAIL_RATE_PER_SECOND": "1000"}
    # Given gunicorn and a worker that know only the Sentinels
    web = start_web(DJANGO_SETTINGS_MODULE="tests.e2e.soak_web_settings", **env)
    worker = start_worker(env=env, threads=4)
    worker.wait_for_log(READY)

    # When users sign up steadily and the primary is SIGKILLed mid-way
    statuses: dict[int, int] = {}
    sent_at: dict[int, float] = {}
    latencies: list[float] = []

    def load(offset: int) -> None:
        n = offset
        started = time.time()
        while time.time() - started < SIGNUP_SECONDS:
            sent_at[n] = time.time()
            statuses[n] = signup(web.port, n)
            latencies.append(time.time() - sent_at[n])
            n += 4
            time.sleep(max(0.0, 4 / SIGNUPS_PER_S - (time.time() - sent_at[n - 4])))

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
        time.sleep(1 / SIGNUPS_PER_S)  # spread evenly, not in bursts of four
    time.sleep(KILL_AFTER_S)
    stalled_s = 0.0
    if fault == "kill":
        sentinel_cluster.kill_primary()
    else:
        old_primary, stalled_s = sentinel_cluster.stall_primary()
    # Taken once the primary is dead (kill_primary waits for it) or failed over:
    # a signup sent just before could still go through it and be mailed at
    # once, which would read as jobs flowing again 0 s after the kill.
    killed_at = time.time()
    for thread in threads:
        thread.join()

    # Then every accepted signup gets one welcome email, from the promoted replica
    accepted = {f"soak{n}@example.com": sent_at[n] for n, s in statuses.items() if s == 201}

    def delivered() -> Counter[str]:
        return Counter(to for to, _ in deliveries(mail_dir))

    deadline = time.time() + 90
    while time.time() < deadline and set(accepted) - set(delivered()):
        time.sleep(0.5)
    time.sleep(2)  # a duplicate would show by now
    mailed = delivered()
    lost = set(accepted) - set(mailed)
    duplicated = sum(count - 1 for count in mailed.values())
    after_kill = sorted(
        at for to, at in deliveries(mail_dir) if to in accepted and accepted[to] > killed_at
    )
    flow_again = after_kill[0] - killed_at if after_kill else float("inf")
    rows = Job.objects.filter(actor_name="send_welcome_email")
    wrong = rows.exclude(state=states.SUCCEEDED).count()
    refused = Counter(s for s in statuses.values() if s != 201)
    report(
        FaultRow(
            FAULTS[fault],
            len(accepted),
            len(lost),
            duplicated,
            wrong + len(accepted) - rows.count(),
            flow_again,
            f"stopped {stalled_s:.1f} s" if stalled_s else "",
        ),
        connection.vendor,
    )
    print(
        f"\nprimary {fault} under {SIGNUPS_PER_S} signups/s: {len(statuses)} signups, "
        f"{len(accepted)} accepted (201), others {refused}, "
        f"slowest answer {max(latencies):.2f} s; emails lost {len(lost)}, duplicated "
        f"{duplicated}; jobs flowed again {flow_again:.1f} s after the {fault}; "
        f"ledger rows {rows.count()}, not succeeded {wrong}"
    )
    assert sentinel_cluster.master_port() == sentinel_cluster.replica.port
    if fault == "stall":
        # The old primary is back, as a replica of the new one
        role = sentinel_cluster.client(old_primary.port).execute_command("ROLE")[0]
        assert role in (b"slave", "slave"), role
    assert len(accepted) == len(statuses), "a signup failed during the failover"
    assert not lost, sorted(lost)[:5]
    assert duplicated == 0
    assert flow_again < 15
    assert rows.count() == len(accepted)
    assert wrong == 0
