"""Fixtures of the per-key concurrency tests."""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import pytest

from jobs.concurrency import keys, slots
from tests.jobs.concurrency.actors import runs


@pytest.fixture(autouse=True)
def _clean_runs() -> None:
    runs.clear()
    # Keys an earlier test's jobs waited on would make this test's releases urgent.
    slots._waited.clear()


@pytest.fixture
def workers(broker: dramatiq.Broker) -> Iterator[list[dramatiq.Worker]]:
    started: list[dramatiq.Worker] = []
    yield started
    for worker in started:
        worker.stop()


@pytest.fixture(params=["key-in-message", "key-not-sent"])
def sender(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Who sent the jobs: this release, which writes each job's key into the
    message so that the fetch takes its slot, or an older one (or any sender
    that bypasses the broker's enqueue), whose jobs get their slots from the
    consumer's second round trip. Both must keep every rule."""
    if request.param == "key-not-sent":
        monkeypatch.setattr(keys, "send_key", lambda message: None)
    return str(request.param)
