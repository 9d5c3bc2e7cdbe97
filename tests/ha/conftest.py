from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import start_web, start_worker, worker_env
from tests.ha.cluster import SentinelCluster

__all__ = ["sentinel_cluster", "start_web", "start_worker", "worker_env"]


@pytest.fixture
def sentinel_cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    cluster = SentinelCluster(tmp_path / "redis")
    try:
        yield cluster
    finally:
        cluster.stop()
