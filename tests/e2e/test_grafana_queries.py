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
from tests.conftest import join
from tests.e2e.conftest import ROOT, free_port
from tests.jobs.ledger.test_timeline import QUEUE, outcome, run_mix

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
DASHBOARD = ROOT / "deploy/grafana/dashboards/jobs.json"
TOKEN = "grafana-test-token"


def api(base: str, path: str, **params: str) -> dict[str, Any]:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as error:
        body = json.load(error)
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
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
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
                # The scrape timeout is the interval unless set: 1 s was too short
                # late in a full run, when /metrics sums several hundred files of
                # finished test processes (0.5 s idle, more on 2 busy cores: up=0).
                "global": {"scrape_interval": "3s", "scrape_timeout": "3s"},
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
        # When Prometheus has scraped the live server a few times
        deadline = time.monotonic() + 60
        while True:
            try:
                up = api(base, "/api/v1/query", query='up{job="jobs-web"}')
                samples = api(base, "/api/v1/query", query="count_over_time(up[1m])")
            except OSError:
                up, samples = {}, {}
            results = samples.get("data", {}).get("result", [])
            if results and float(results[0]["value"][1]) >= 3:
                break
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
        assert up["data"]["result"][0]["value"][1] == "1", up
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
