"""Fixtures of the per-key concurrency tests."""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import pytest

from tests.jobs.concurrency.actors import runs


@pytest.fixture(autouse=True)
def _clean_runs() -> None:
    runs.clear()


@pytest.fixture
def workers(broker: dramatiq.Broker) -> Iterator[list[dramatiq.Worker]]:
    started: list[dramatiq.Worker] = []
    yield started
    for worker in started:
        worker.stop()
