"""Metrics from a worker subprocess, shared request ids in real logs, /healthz vs Redis."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from project.redis_server import RedisServer
from tests.e2e.conftest import free_port
from tests.jobs.observability.test_metrics import value

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
TOKEN = {"METRICS_TOKEN": "e2e-token", "LOG_FORMAT": "json"}


def get(url: str, **headers: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def signup(base: str, name: str, request_id: str) -> int:
    body = {"username": name, "email": f"{name}@example.com", "password": "correct-horse-battery"}
    request = urllib.request.Request(
        f"{base}/api/signup/",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Request-ID": request_id},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["X-Request-ID"] == request_id
        return int(json.load(response)["data"]["id"])


def json_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def wait_for(predicate: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_a_signup_and_its_job_share_the_request_id_and_show_in_metrics(
    start_web: Any, start_worker: Any, worker_env: dict[str, str]
) -> None:
    web = start_web(**TOKEN)
    worker = start_worker(env=TOKEN)
    worker.wait_for_log("Worker process is ready for action.")
    status, before = get(f"{web.url}/metrics", Authorization="Bearer e2e-token")
    assert status == 200
    request_id = uuid.uuid4().hex

    signup(web.url, "grace", request_id)
    mail_dir = Path(worker_env["EMAIL_FILE_PATH"])
    wait_for(lambda: any(mail_dir.glob("*.log")))
    wait_for(lambda: "Welcome email sent" in worker.log())  # logged right after the send

    web_lines = [r for r in json_lines(web.log_path) if r.get("request_id") == request_id]
    job_lines = [r for r in json_lines(worker.log_path) if r.get("request_id") == request_id]
    assert any("Registered user" in r["message"] for r in web_lines)
    assert job_lines, worker.log()
    assert all(r["actor"] == "send_welcome_email" and r["attempt"] == 1 for r in job_lines)
    assert len({r["job_id"] for r in job_lines}) == 1
    assert all(r["queue"] == "emails" for r in job_lines)

    def processed() -> float:
        text = get(f"{web.url}/metrics", Authorization="Bearer e2e-token")[1]
        return value(text, "jobs_processed_total", actor="send_welcome_email", outcome="succeeded")

    base = value(before, "jobs_processed_total", actor="send_welcome_email", outcome="succeeded")
    wait_for(lambda: processed() == base + 1)
    _, after = get(f"{web.url}/metrics", Authorization="Bearer e2e-token")
    assert value(after, "signups_total") == value(before, "signups_total") + 1
    assert value(after, "jobs_workers_alive") >= 1


def test_healthz_is_503_while_redis_is_down_and_200_once_it_is_back(
    start_web: Any, tmp_path: Path
) -> None:
    redis = RedisServer(free_port(), tmp_path / "redis").start()
    web = start_web(REDIS_URL=redis.url)
    try:
        status, body = get(f"{web.url}/healthz")
        assert (status, json.loads(body)["status"]) == (200, "ok")

        redis.stop()
        status, body = get(f"{web.url}/healthz")
        checks = json.loads(body)["checks"]
        assert status == 503
        assert checks["database"] == "ok"
        assert checks["redis"].startswith("down")
        assert checks["broker"].startswith("down")

        redis.start()
        wait_for(lambda: get(f"{web.url}/healthz")[0] == 200)
    finally:
        redis.stop()


def test_a_worker_killed_mid_job_leaves_no_job_in_progress_and_keeps_its_counts(
    start_worker: Any, client: Any, settings: Any
) -> None:
    from tests.examples.tasks import long_job

    settings.JOBS_METRICS_TOKEN = "e2e-token"

    def scrape() -> str:
        response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer e2e-token")
        assert response.status_code == 200
        return str(response.content.decode())

    def figure(name: str, **labels: str) -> float:
        return value(scrape(), name, actor="long_job", **labels)

    # Given a worker process that finished one job and is in the middle of another
    worker = start_worker(threads=2, queues=("long",))
    worker.wait_for_log("Worker process is ready for action.")
    done_before = figure("jobs_processed_total", outcome="succeeded")
    long_job.send("phantom-done", 0.01)
    wait_for(lambda: figure("jobs_processed_total", outcome="succeeded") == done_before + 1)
    long_job.send("phantom", 300)
    wait_for(lambda: figure("jobs_in_progress") == 1)

    # When its whole process group is SIGKILLed (no exit hook runs)
    worker.kill()

    # Then the next scrapes show no job in progress, and the job it finished is
    # still counted
    wait_for(lambda: figure("jobs_in_progress") == 0, timeout=5)
    assert figure("jobs_processed_total", outcome="succeeded") == done_before + 1
