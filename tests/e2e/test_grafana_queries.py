"""Every Grafana panel's query, run by a real Prometheus that scraped a running system."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import dramatiq
import pytest

from jobs.consistency.cache import cached
from jobs.consistency.locks import redis_lock
from tests.conftest import IDLE_POLL_MS, join
from tests.e2e.conftest import ROOT, free_port
from tests.jobs.ledger.test_timeline import QUEUE, outcome, run_mix

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_row("sqlite", "Prometheus parses the panels' queries, whatever the database"),
]
DASHBOARD = ROOT / "deploy/grafana/dashboards/jobs.json"
TOKEN = "grafana-test-token"


def api(base: str, path: str, **params: str) -> dict[str, Any]:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as error:
        try:
            body = json.load(error)  # a query Prometheus refused says why, in JSON
        except ValueError:
            # Not ready yet ("Service Unavailable" while its storage starts).
            body = {"status": "unavailable", "code": error.code}
    return body


def test_every_panel_query_parses_and_returns_series(
    live_server: Any, broker: dramatiq.Broker, settings: Any, tmp_path: Path
) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        print("SKIP: the prometheus binary is not on PATH (apt-get install prometheus)")
        pytest.skip(reason="the prometheus binary is not on PATH (apt-get install prometheus)")
    settings.JOBS_METRICS_TOKEN = TOKEN
    # Given a system that ran real jobs, a lock and cache reads
    run_mix(broker, succeed=3, fail=1, retry=1)
    with redis_lock("grafana-test", ttl=10, wait=1):
        pass
    for _ in range(3):
        cached("grafana-test", "1", lambda: 1, ttl=60)
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1)
    worker.start()  # a live worker for jobs_workers_alive and running figures
    # run_mix stopped a worker in this process: its live gauges (jobs_in_progress)
    # must still be served (they once vanished with the stopped worker).
    outcome.send("ok", "live")
    join(QUEUE)
    host = live_server.url.removeprefix("http://")
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "prometheus.yml").write_text(
        json.dumps(
            {
                # The scrape timeout is the interval unless set: 1 s, then 3 s, were
                # too short late in a full run on 2 busy cores (this test waited 62 s
                # for 3 answers in 3 s in one rehearsal, and CI once saw up=0).
                "global": {"scrape_interval": "5s", "scrape_timeout": "5s"},
                "scrape_configs": [
                    {
                        "job_name": "jobs-web",
                        "authorization": {"credentials_file": str(tmp_path / "token")},
                        "static_configs": [{"targets": [host]}],
                    }
                ],
            }
        )
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - handed to the child
    prometheus = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # When Prometheus has scraped the live server successfully 3 times (a
        # scrape that outlasts its 3 s timeout on a loaded 2-core machine is
        # not a failure of /metrics; one that never answers in time is)
        deadline = time.monotonic() + 80  # within pytest's 120 s with the setup
        while True:
            try:
                answer = api(base, "/api/v1/query", query='sum_over_time(up{job="jobs-web"}[1m])')
            except OSError:
                answer = {}
            results = answer.get("data", {}).get("result", [])
            if results and float(results[0]["value"][1]) >= 3:
                break
            if time.monotonic() > deadline:
                # The target's last error and scrape time say why.
                targets = api(base, "/api/v1/targets").get("data", {}).get("activeTargets", [])
                raise AssertionError(
                    [(t.get("lastError"), t.get("lastScrapeDuration")) for t in targets]
                    + [(tmp_path / "prometheus.log").read_text()[-2000:]]
                )
            time.sleep(0.5)
        # Then every panel's query parses and returns at least one series
        panels = json.loads(DASHBOARD.read_text())["panels"]
        assert len(panels) >= 11
        empty = []
        for panel in panels:
            for target in panel["targets"]:
                answer = api(base, "/api/v1/query", query=target["expr"])
                assert answer["status"] == "success", (panel["title"], answer)
                if not answer["data"]["result"]:
                    empty.append(panel["title"])
        assert empty == []
    finally:
        prometheus.terminate()
        prometheus.wait(10)
        log.close()
        worker.stop()
