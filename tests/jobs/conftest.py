from __future__ import annotations

import os
from collections.abc import Iterator

import dramatiq
import pytest
from django.conf import settings

from jobs.middleware.dedup import Dedup


@pytest.fixture
def dedup_middleware(broker: dramatiq.Broker) -> Iterator[Dedup]:
    """The Dedup middleware the settings put on the broker."""
    [middleware] = [m for m in broker.middleware if isinstance(m, Dedup)]
    yield middleware
    assert middleware in broker.middleware


@pytest.fixture
def subprocess_env(test_database_url: str) -> dict[str, str]:
    """Environment for ``python -m tests.jobs.<helper>`` sharing this test's database and Redis."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.worker_settings",  # shipped settings + example actors
        "DATABASE_URL": test_database_url,
        "REDIS_URL": settings.REDIS_URL,
        "PYTHONUNBUFFERED": "1",
    }
