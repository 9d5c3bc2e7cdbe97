"""A real Redis primary, one replica and three Sentinels on 127.0.0.1, for tests.

Each server is a ``redis-server`` child process with its own free port and
directory; the Sentinels are ``redis-server <conf> --sentinel`` (no Debian
``redis-sentinel`` package needed). Timings are short so a failover takes
seconds in a test (see ``DOWN_AFTER_MS``); production keeps Sentinel's defaults
or close to them (docs/howto/several-hosts.md).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from project.redis_server import find_redis_server, wait_until_ready

MASTER = "mymaster"
# The primary is declared down after 1 s of silence instead of the shipped 30 s:
# the test measures what clients do during a failover, not how patient
# Sentinel is. 1 s stays far above loopback latency, so no false failover.
DOWN_AFTER_MS = 1000
# Bounds a failover attempt that stalls (e.g. a Sentinel dies mid-election);
# Sentinel's default of 3 minutes would outlast the test.
FAILOVER_TIMEOUT_MS = 5000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Process:
    """One redis-server (data or Sentinel) child, killed with its test."""

    def __init__(self, name: str, directory: Path, args: list[str], port: int) -> None:
        self.name = name
        self.port = port
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        log = open(directory / f"{name}.log", "ab")  # noqa: SIM115 - lives with the child
        self.process = subprocess.Popen(
            [find_redis_server(), *args], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        wait_until_ready(port)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def alive(self) -> bool:
        return self.process.poll() is None


def data_server(name: str, directory: Path, *, replica_of: int | None = None) -> Process:
    port = free_port()
    args = [
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--appendonly",
        "yes",
        "--save",
        "",
    ]
    if replica_of is not None:
        args += ["--replicaof", "127.0.0.1", str(replica_of)]
    return Process(name, directory, args, port)


def sentinel(name: str, directory: Path, primary_port: int) -> Process:
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / f"{name}.conf"  # Sentinel rewrites it: a file of its own
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
        f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n"
        f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
        f"sentinel parallel-syncs {MASTER} 1\n"
    )
    return Process(name, directory, [str(conf), "--sentinel"], port)


class SentinelCluster:
    """Primary + replica + 3 Sentinels (quorum 2)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.primary = data_server("primary", directory / "primary")
        self.replica = data_server("replica", directory / "replica", replica_of=self.primary.port)
        self.sentinels = [
            sentinel(f"sentinel{i}", directory / f"sentinel{i}", self.primary.port)
            for i in range(3)
        ]
        self.wait_until_replicated()
        self.wait_until_sentinels_agree(self.primary.port)

    @property
    def env(self) -> dict[str, str]:
        """Settings that point an app process at this cluster through Sentinel.

        ``REDIS_URL`` names a port where nothing listens: a client that bypassed
        Sentinel would fail instead of quietly working.
        """
        return {
            "REDIS_SENTINELS": ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels),
            "REDIS_SENTINEL_MASTER": MASTER,
            "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        }

    def client(self, port: int, db: int = 0) -> Any:
        # Any: redis-py's execute_command is untyped, and Sentinel commands need it.
        return redis.Redis(port=port, db=db, socket_timeout=2)

    def master_port(self) -> int | None:
        """The primary's port as most Sentinels report it now."""
        ports = []
        for s in self.sentinels:
            if not s.alive():
                continue
            try:
                reply = self.client(s.port).execute_command(
                    "SENTINEL", "get-master-addr-by-name", MASTER
                )
            except redis.RedisError:
                continue
            if reply:
                ports.append(int(reply[1]))
        return max(set(ports), key=ports.count) if ports else None

    def wait_until_replicated(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.client(self.replica.port).info("replication")
            if info.get("master_link_status") == "up":
                return
            time.sleep(0.1)
        raise TimeoutError("replica never synchronised with the primary")

    def wait_until_sentinels_agree(self, port: int, timeout: float = 20) -> float:
        """Seconds until every live Sentinel names ``port`` and knows the others."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if all(self._sees(s, port) for s in self.sentinels if s.alive()):
                return time.monotonic() - started
            time.sleep(0.1)
        raise TimeoutError(f"Sentinels did not agree on port {port} within {timeout} s")

    def _sees(self, s: Process, port: int) -> bool:
        try:
            client = self.client(s.port)
            addr = client.execute_command("SENTINEL", "get-master-addr-by-name", MASTER)
            others = client.execute_command("SENTINEL", "sentinels", MASTER)
        except redis.RedisError:
            return False
        return bool(addr) and int(addr[1]) == port and len(others) >= 2

    def kill_primary(self) -> Process:
        """SIGKILL the current primary; return it."""
        port = self.master_port()
        victim = self.primary if port == self.primary.port else self.replica
        victim.kill()
        return victim

    def stall_primary(self) -> tuple[Process, float]:
        """SIGSTOP the current primary until every Sentinel names the replica,
        then SIGCONT it (a stalled host, a VM paused): it comes back believing
        it is the primary until Sentinel makes it a replica of the new one.
        Returns it and how long it was stopped."""
        port = self.master_port()
        victim, other = (
            (self.primary, self.replica)
            if port == self.primary.port
            else (self.replica, self.primary)
        )
        victim.process.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        try:
            self.wait_until_sentinels_agree(other.port, timeout=30)
        finally:
            victim.process.send_signal(signal.SIGCONT)
        return victim, time.monotonic() - started

    def stop(self) -> None:
        for process in [*self.sentinels, self.replica, self.primary]:
            process.kill()
