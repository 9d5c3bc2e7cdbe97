"""Start and stop a private, throw-away PostgreSQL cluster (``bin/test --postgres``).

``initdb`` and ``pg_ctl`` come from PATH, else from Debian's
``/usr/lib/postgresql/<version>/bin`` (the ``postgresql`` package keeps them off
PATH). The cluster lives in the given directory (data, log and unix socket), trusts
every local connection, listens on 127.0.0.1 only and skips fsync: it is for tests,
never for data. PostgreSQL refuses to run as root, so as root it runs as the
``postgres`` user, which then owns the directory.

    python -m project.postgres_server start DIR   # prints the DATABASE_URL
    python -m project.postgres_server stop DIR    # stops it and removes DIR
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

SUPERUSER = "postgres"


def find_pg_binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found

    def version(path: str) -> list[int]:
        return [int(part) for part in re.findall(r"\d+", Path(path).parts[-3])]

    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=version)
    if candidates:
        return candidates[-1]
    raise RuntimeError(
        f"No {name} on PATH or under /usr/lib/postgresql/*/bin: apt-get install postgresql"
    )


def _as_owner() -> list[str]:
    """Command prefix that runs a PostgreSQL binary as a user it accepts."""
    return ["runuser", "-u", SUPERUSER, "--"] if os.geteuid() == 0 else []


def _run(command: list[str]) -> None:
    done = subprocess.run(_as_owner() + command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{done.stdout}{done.stderr}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start(directory: Path, *, attempts: int = 3) -> str:
    """Create a cluster in ``directory`` (an empty directory), start it, return its URL."""
    if os.geteuid() == 0:
        shutil.chown(directory, user=SUPERUSER, group=SUPERUSER)
    data = directory / "data"
    # UTF8 with C collation whatever the caller's locale (an unset LANG means SQL_ASCII).
    _run(
        [
            find_pg_binary("initdb"),
            *("-D", str(data), "-A", "trust", "-U", SUPERUSER),
            *("-E", "UTF8", "--locale=C", "--no-sync"),
        ]
    )
    for attempt in range(attempts):
        port = _free_port()
        options = (
            f"-p {port} -k {shlex.quote(str(directory))} -c listen_addresses=127.0.0.1 -c fsync=off"
        )
        try:
            _run(
                [
                    find_pg_binary("pg_ctl"),
                    *("-D", str(data), "-l", str(directory / "postgres.log")),
                    *("-o", options, "-w", "-t", "60", "start"),
                ]
            )
        except RuntimeError:
            if attempt == attempts - 1:  # else the free port was taken meanwhile: retry
                raise
        else:
            break
    return f"postgres://{SUPERUSER}@127.0.0.1:{port}/postgres"


def stop(directory: Path) -> None:
    """Stop the cluster in ``directory`` if it runs, then remove ``directory``."""
    data = directory / "data"
    if (data / "postmaster.pid").exists():
        _run([find_pg_binary("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
    shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A private PostgreSQL cluster for tests.")
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("dir", type=Path, help="the cluster's directory (data, log, socket)")
    args = parser.parse_args(argv)
    if args.action == "start":
        print(start(args.dir))
    else:
        stop(args.dir)


if __name__ == "__main__":
    main()
