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
def subprocess_env() -> dict[str, str]:
    """Environment for ``python -m tests.jobs.<helper>`` sharing this test's database and Redis."""
    database = settings.DATABASES["default"]
    assert database["ENGINE"].endswith("sqlite3"), "subprocess tests share the SQLite test file"
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.worker_settings",  # shipped settings + example actors
        "DATABASE_URL": f"sqlite:///{database['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "PYTHONUNBUFFERED": "1",
    }
