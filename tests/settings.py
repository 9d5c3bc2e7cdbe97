"""Test settings: the project's settings with a private Redis and fast hashing.

The broker is built once at ``django.setup()`` (before any fixture runs), so the
Redis address is chosen here: ``REDIS_URL`` if given (it must be disposable: the
suite flushes it), otherwise a free local port on which ``tests/redis_server.py``
starts a private ``redis-server`` for the session. Redis clients connect lazily,
so nothing talks to that port before the server is up.

The database is ``DATABASE_URL``'s (SQLite when unset); pytest-django creates the
test database next to it. ``bin/test --postgres`` points ``DATABASE_URL`` at a
private PostgreSQL cluster. Subprocesses get the test database through the
``test_database_url`` fixture (``tests/conftest.py``), whatever the engine.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


if os.environ.get("TEST_DATABASE", "sqlite") == "postgres" and not os.environ.get(
    "DATABASE_URL", ""
).startswith(("postgres://", "postgresql://")):
    # Without this, TEST_DATABASE=postgres pytest would run on SQLite unnoticed.
    raise RuntimeError("TEST_DATABASE=postgres needs a postgres DATABASE_URL: use bin/test")
if not os.environ.get("REDIS_URL"):
    os.environ["REDIS_URL"] = f"redis://127.0.0.1:{_free_port()}/0"
    os.environ["TEST_MANAGED_REDIS"] = "1"
# Small backoff so retry tests take a fraction of a second: 200 ms, 400 ms.
os.environ.setdefault("JOBS_MIN_BACKOFF_MS", "200")
os.environ.setdefault("JOBS_MAX_BACKOFF_MS", "2000")
# Everything else runs with the shipped defaults (signup rate limit on, 200 ms
# ledger batches, 1 s control refresh), here and in every worker subprocess a
# test starts from this environment. A test that needs another value sets it
# for itself (the ``settings`` fixture, or its subprocess's env) and says why.
# Ours to remove after a passing run (tests/conftest.py) unless the caller named it.
TEST_TMP_OWNED = "TEST_TMP_DIR" not in os.environ
TEST_TMP = Path(os.environ.setdefault("TEST_TMP_DIR", tempfile.mkdtemp(prefix="jobs-tests-")))
os.environ.setdefault("VAR_DIR", str(TEST_TMP / "var"))
# A fresh metrics directory per session, shared with worker subprocesses.
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(TEST_TMP / "prometheus")

from project.settings import *  # noqa: E402,F403

# On SQLite, a file database (not :memory:) so worker subprocesses in e2e tests
# see the rows the test wrote.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": str(TEST_TMP / "test.sqlite3")}  # noqa: F405
# The test process keeps no database connection between uses (SQLite never does):
# otherwise a product thread that outlives its test (the ledger's batch writer)
# keeps a PostgreSQL connection into tests where pytest-django blocks database
# access (the thread then dies on its next close_old_connections()) and into the
# test database's teardown ("being accessed by other users"). Worker and web
# subprocesses use project.settings, persistent connections included.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Example actors (demo_pipeline) that the tests drive; production never loads them.
INSTALLED_APPS = [*INSTALLED_APPS, "tests.examples"]  # noqa: F405
