"""The whole system spread over network-namespace hosts (see netbed.py).

Hosts: redis1 (primary), redis2 (replica), sent1-3 (Sentinels), db
(PostgreSQL), web (gunicorn), work1 and work2 (rundramatiq), sched
(runscheduler). Every app process finds Redis through the Sentinels.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from project.postgres_server import find_pg_binary
from project.redis_server import find_redis_server
from tests.multihost.netbed import Host, NetBed, NetBedUnavailable

ROOT = Path(__file__).resolve().parents[2]
MASTER = "mymaster"
# 5 s instead of the shipped 15 s: the partition scenarios wait for it to pass.
HEARTBEAT_TIMEOUT_MS = 5000
READY = "Worker process is ready for action."


def wait_for(predicate: Any, timeout: float, what: str, every: float = 0.2) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if predicate():
                return time.monotonic() - started
        except Exception:
            pass
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s")


class System:
    def __init__(self, bed: NetBed) -> None:
        self.bed = bed
        self.dir = bed.directory
        self.hosts: dict[str, Host] = {}
        self.workers: dict[str, Any] = {}

    def host(self, name: str) -> Host:
        return self.bed.hosts[name]

    # --- start-up -------------------------------------------------------------

    def start(self) -> None:
        for name in ("redis1", "redis2", "sent1", "sent2", "sent3", "db", "web"):
            self.bed.add_host(name)
        for name in ("work1", "work2", "sched"):
            self.bed.add_host(name)
        self._start_redis()
        self._start_postgres()
        self.env = self._app_env()
        self.bed.run(self.host("web"), [sys.executable, "manage.py", "migrate", "-v0"], self.env)
        self.web = self.bed.spawn(
            self.host("web"),
            [sys.executable, "-m", "gunicorn", "project.wsgi", "--workers", "2"],
            {
                **self.env,
                "GUNICORN_BIND": f"{self.host('web').ip}:8000",
                "DJANGO_SETTINGS_MODULE": "tests.e2e.soak_web_settings",
            },
            "web.log",
            cwd=ROOT,
        )
        wait_for(lambda: self.get("/healthz")[0] == 200, 30, "web up")
        for name in ("work1", "work2"):
            self.start_worker(name)
        self.bed.spawn(
            self.host("sched"), [sys.executable, "manage.py", "runscheduler"], self.env,
            "sched.log", cwd=ROOT,
        )  # fmt: skip
        for name in ("work1", "work2"):
            wait_for(lambda n=name: READY in self.log(f"{n}.log"), 60, f"{name} ready")

    def _start_redis(self) -> None:
        primary = self.host("redis1").ip
        self.start_redis("redis1")
        self.start_redis("redis2", replica_of="redis1")
        for name in ("sent1", "sent2", "sent3"):
            conf = self.dir / f"{name}.conf"
            # 2 s down-after and a 10 s failover timeout: a failover in seconds, as
            # in tests/ha/cluster.py; production keeps Sentinel's longer defaults.
            conf.write_text(
                f"port 26379\nbind {self.host(name).ip}\nprotected-mode no\ndir {self.dir}\n"
                f"sentinel monitor {MASTER} {primary} 6379 2\n"
                f"sentinel down-after-milliseconds {MASTER} 2000\n"
                f"sentinel failover-timeout {MASTER} 10000\n"
            )
            self.bed.spawn(self.host(name), [find_redis_server(), str(conf), "--sentinel"],
                           dict(os.environ), f"{name}.log")  # fmt: skip
        self.wait_for_replica("redis2")

    def start_redis(self, name: str, *, replica_of: str | None = None) -> None:
        """Start (or start again, on its data) the Redis server of host ``name``."""
        data = self.dir / name
        data.mkdir(exist_ok=True)
        extra = ["--replicaof", self.host(replica_of).ip, "6379"] if replica_of else []
        argv = [find_redis_server(), "--port", "6379", "--bind", self.host(name).ip,
                "--dir", str(data), "--appendonly", "yes", "--save", "",
                # the bed is a closed network: other hosts must get in, password-less
                "--protected-mode", "no", *extra]  # fmt: skip
        self.bed.spawn(self.host(name), argv, dict(os.environ), f"{name}.log")

    def wait_for_replica(self, name: str, timeout: float = 30) -> float:
        replica = redis.Redis(host=self.host(name).ip, port=6379, socket_timeout=1)
        return wait_for(
            lambda: replica.info("replication")["master_link_status"] == "up", timeout,
            f"{name} replicating",
        )  # fmt: skip

    def redis_primary(self) -> str | None:
        """The host most Sentinels name as the Redis primary now."""
        by_ip = {self.host(n).ip: n for n in ("redis1", "redis2")}
        named = []
        for sentinel in ("sent1", "sent2", "sent3"):
            # Any: redis-py's execute_command is untyped, and Sentinel commands need it.
            client: Any = redis.Redis(host=self.host(sentinel).ip, port=26379, socket_timeout=1)
            try:
                reply = client.execute_command("SENTINEL", "get-master-addr-by-name", MASTER)
            except redis.RedisError:
                continue
            if reply:
                named.append(by_ip.get(reply[0].decode(), reply[0].decode()))
        return max(set(named), key=named.count) if named else None

    def kill_redis_primary(self) -> str:
        """SIGKILL the Redis server the Sentinels name as primary; return its host."""
        name = self.redis_primary()
        assert name in ("redis1", "redis2"), f"no primary to kill: Sentinels name {name}"
        assert self.bed.kill_host(self.host(name)) == 1, f"{name} ran more than redis-server"
        return name

    def _start_postgres(self) -> None:
        data = self.dir / "pg"
        data.mkdir()
        shutil.chown(data, "postgres", "postgres")
        db = self.host("db")
        self.bed.run(db, [find_pg_binary("initdb"), "-D", str(data / "data"), "-A", "trust",
                          "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"],
                     dict(os.environ), user="postgres")  # fmt: skip
        with open(data / "data" / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all 10.{self.bed.subnet}.0.0/24 trust\n")
        self.pg_ctl("start")

    def pg_ctl(self, *args: str) -> None:
        data = self.dir / "pg"
        options = f"-p 5432 -k {data} -c listen_addresses={self.host('db').ip} -c fsync=off"
        self.bed.run(self.host("db"), [find_pg_binary("pg_ctl"), "-D", str(data / "data"),
                     "-l", str(data / "postgres.log"), "-o", options, "-w", *args],
                     dict(os.environ), user="postgres")  # fmt: skip

    def _app_env(self) -> dict[str, str]:
        sentinels = ",".join(f"{self.host(n).ip}:26379" for n in ("sent1", "sent2", "sent3"))
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "JOBS_"))},
            "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
            "DJANGO_ALLOWED_HOSTS": self.host("web").ip,
            "DATABASE_URL": f"postgres://postgres@{self.host('db').ip}:5432/postgres",
            "REDIS_URL": "redis://unused:6379/0",
            "REDIS_SENTINELS": sentinels,
            "REDIS_SENTINEL_MASTER": MASTER,
            "JOBS_HEARTBEAT_TIMEOUT_MS": str(HEARTBEAT_TIMEOUT_MS),
            # The whole load comes from one address (the test's leg).
            "SIGNUP_RATE_LIMIT": "off",
            "WELCOME_EMAIL_RATE_PER_SECOND": "1000",
            "VAR_DIR": str(self.dir / "var"),
            "PROMETHEUS_MULTIPROC_DIR": str(self.dir / "prometheus"),
            "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "PYTHONUNBUFFERED": "1",
        }

    def start_worker(self, name: str) -> None:
        mail = self.dir / f"mail-{name}"
        mail.mkdir(exist_ok=True)
        self.workers[name] = self.bed.spawn(
            self.host(name),
            [sys.executable, "manage.py", "rundramatiq", "--processes", "1", "--threads", "4",
             "--worker-shutdown-timeout", "5000"],
            {**self.env, "EMAIL_FILE_PATH": str(mail)},
            f"{name}.log",
            cwd=ROOT,
        )  # fmt: skip

    # --- driving and inspecting -----------------------------------------------

    def log(self, name: str) -> str:
        path = self.dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        connection = http.client.HTTPConnection(self.host("web").ip, 8000, timeout=30)
        try:
            payload = json.dumps(body) if body is not None else None
            connection.request(method, path, payload, {"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, response.read().decode(errors="replace")
        finally:
            connection.close()

    def get(self, path: str) -> tuple[int, str]:
        return self.request("GET", path)

    def signup(self, username: str) -> int:
        body = {"username": username, "email": f"{username}@example.com",
                "password": "Correct-horse-9"}  # fmt: skip
        try:
            return self.request("POST", "/api/signup/", body)[0]
        except OSError:
            return 0

    def deliveries(self) -> list[tuple[str, float]]:
        """(recipient, time written) of every email the worker hosts' file backends wrote."""
        found = []
        for path in self.dir.glob("mail-*/*.log"):
            written = path.stat().st_mtime
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("To: "):
                    found.append((line[len("To: ") :], written))
        return found

    def mailed(self) -> Counter[str]:
        return Counter(to for to, _ in self.deliveries())

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        import psycopg

        url = f"postgresql://postgres@{self.host('db').ip}:5432/postgres"
        with psycopg.connect(url, connect_timeout=5) as connection:
            return connection.execute(query, params).fetchall()

    def ledger(self, actor: str) -> Counter[str]:
        rows = self.sql(
            "select state, count(*) from jobs_job where actor_name = %s group by 1", actor
        )
        return Counter({state: count for state, count in rows})

    def send(self, code: str) -> None:
        """Run ``code`` with Django set up on the web host (to enqueue jobs)."""
        self.bed.run(self.host("web"), [sys.executable, "manage.py", "shell", "-c", code], self.env)


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    directory = Path(tempfile.mkdtemp(prefix="multihost-"))
    directory.chmod(0o755)  # PostgreSQL runs as its own user and must reach its data
    try:
        bed = NetBed.create(directory)
    except NetBedUnavailable as exc:
        print(f"\nmultihost tests skipped: {exc}")
        pytest.skip(reason=f"multihost: {exc}")
    system = System(bed)
    try:
        system.start()
        yield system
    finally:
        bed.close()
        if os.environ.get("MULTIHOST_KEEP_LOGS") != "1":
            shutil.rmtree(directory, ignore_errors=True)
        else:
            print(f"\nmultihost logs kept in {directory}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A minute of namespaces, PostgreSQL and ten processes: run once in CI, on
    # request (-m multihost), not in every bin/test of the suite.
    expression = str(config.getoption("-m") or "")
    if "multihost" in expression and "not multihost" not in expression:
        return
    skip = pytest.mark.skip(reason="multihost: run with -m multihost (needs root)")
    for item in items:
        if "multihost" in item.keywords:
            item.add_marker(skip)
