"""A signup over HTTP reaches a real ``rundramatiq`` subprocess and mails the user."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def wait_for_files(directory: Path, *, count: int, timeout: float) -> list[Path]:
    """Mail files the file backend has finished writing (it ends each with a rule)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = [f for f in sorted(directory.glob("*.log")) if "-" * 79 in f.read_text()]
        if len(files) >= count:
            return files
        time.sleep(0.02)
    raise AssertionError(f"expected {count} email file(s) in {directory} within {timeout} s")


def test_a_signup_is_mailed_by_a_real_worker_process(live_server, start_worker, worker_env) -> None:
    worker = start_worker()
    worker.wait_for_log("Worker process is ready for action.")
    request = urllib.request.Request(
        f"{live_server.url}/api/signup/",
        data=json.dumps(
            {"username": "linus", "email": "linus@example.com", "password": "correct-horse-battery"}
        ).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )

    sent_at = time.monotonic()
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
        user_id = json.load(response)["data"]["id"]
    [email_file] = wait_for_files(Path(worker_env["EMAIL_FILE_PATH"]), count=1, timeout=20)
    latency = time.monotonic() - sent_at

    content = email_file.read_text()
    assert "To: linus@example.com" in content
    assert "Hello linus" in content
    print(f"user {user_id}: 201 -> email on disk in {latency * 1000:.0f} ms")

    assert worker.terminate() == 0
    assert "Worker process is ready for action." in worker.log()
