"""The bench's own PostgreSQL cluster, for the scenarios that put the ledger on it.

Started only when such a scenario runs, in the bench's work directory, through
project.postgres_server (fsync off, trust, 127.0.0.1 only), and stopped and
removed when the scenario ends, whatever happened. One template database is
migrated once; each drain gets ``CREATE DATABASE ... TEMPLATE`` of it (tens of
milliseconds) and drops it afterwards, so runs are independent and autovacuum
never works through an earlier run's rows while the next one is measured.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench import procs
from project import postgres_server

TEMPLATE = "bench_template"


def missing() -> str | None:
    """Why no cluster can start here (a missing binary or driver), else None."""
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed: pip install -e '.[postgres]'"
    try:
        for name in ("initdb", "pg_ctl"):
            postgres_server.find_pg_binary(name)
    except RuntimeError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Cluster:
    url: str  # its maintenance database, "postgres"

    def database_url(self, name: str) -> str:
        return urlsplit(self.url)._replace(path=f"/{name}").geturl()

    def create_template(self) -> None:
        self._execute("CREATE DATABASE {}", TEMPLATE)
        env = procs.base_env(DATABASE_URL=self.database_url(TEMPLATE))
        procs.manage("migrate", "--noinput", env=env)

    @contextmanager
    def fresh_database(self, tag: str) -> Iterator[str]:
        """A copy of the migrated template for one drain, dropped after it."""
        name = re.sub(r"[^a-z0-9_]", "_", f"run_{tag}".lower())[:63]
        self._execute("CREATE DATABASE {} TEMPLATE {}", name, TEMPLATE)
        try:
            yield self.database_url(name)
        finally:
            # FORCE: a worker killed after its stop timed out may hold a connection.
            self._execute("DROP DATABASE IF EXISTS {} WITH (FORCE)", name)

    def _execute(self, statement: str, *names: str) -> None:
        import psycopg
        from psycopg import sql

        query = sql.SQL(statement).format(*(sql.Identifier(name) for name in names))
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(query)


@contextmanager
def cluster(workdir: Path) -> Iterator[Cluster]:
    """A running cluster with a migrated template, in ``workdir/postgres``."""
    directory = workdir / "postgres"
    directory.mkdir()
    if os.geteuid() == 0:
        # As root the cluster runs as the postgres user, which has to get
        # through mkdtemp's 0700 work directory to reach its own.
        workdir.chmod(0o711)
    try:
        running = Cluster(postgres_server.start(directory))
        running.create_template()
        yield running
    finally:
        postgres_server.stop(directory)
