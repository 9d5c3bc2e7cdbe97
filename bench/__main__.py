"""``python -m bench [--quick] [--only NAME ...] [--runs N]``: starts its own redis-server."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small N, for a smoke run")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only NAME (repeat)")
    parser.add_argument("--runs", type=int, default=5, help="runs per variant (median taken)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)

    from project.redis_server import RedisServer

    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    server = RedisServer(_free_port(), workdir / "redis", appendonly=False).start()
    try:
        # The broker and the cache read REDIS_URL once, at django.setup().
        os.environ["REDIS_URL"] = server.url
        os.environ.setdefault("DATABASE_URL", f"sqlite:///{workdir / 'db.sqlite3'}")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
        os.environ.setdefault("LOG_LEVEL", "WARNING")
        import django

        django.setup()
        import bench.scenarios  # noqa: F401 - registers the scenarios
        from bench.registry import SCENARIOS, run, table

        if args.list:
            for item in SCENARIOS.values():
                print(f"{item.name:16} {item.description}")
            return 0
        unknown = set(args.only or []) - set(SCENARIOS)
        if unknown:
            parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
        chosen = [s for name, s in SCENARIOS.items() if not args.only or name in args.only]
        results = [run(item, quick=args.quick, runs=args.runs) for item in chosen]
        print(table(results))
        return 0 if all(result.ok for result in results) else 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
