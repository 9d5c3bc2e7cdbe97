"""``python -m bench [--quick] [--only NAME ...] [--runs N]``.

Starts its own redis-server, a migrated SQLite database and, per scenario,
worker and gunicorn subprocesses (and, for throughput-pg only, a PostgreSQL
cluster); everything lives in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import shutil
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
    parser.add_argument(
        "--runs",
        type=int,
        help="runs per variant, median taken (default 5 for loops, 3 for processes)",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)

    from project.redis_server import RedisServer

    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    server = RedisServer(_free_port(), workdir / "redis", appendonly=False).start()
    try:
        # The broker and the cache read REDIS_URL once, at django.setup(); the
        # worker and gunicorn subprocesses inherit all of these.
        os.environ["REDIS_URL"] = server.url
        os.environ["DATABASE_URL"] = f"sqlite:///{workdir / 'db.sqlite3'}"
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
        os.environ["VAR_DIR"] = str(workdir / "var")
        os.environ["DJANGO_ALLOWED_HOSTS"] = "localhost,127.0.0.1,testserver"
        os.environ.setdefault("LOG_LEVEL", "WARNING")
        import django

        django.setup()
        # Importing registers the scenarios (after set-up: they use the broker).
        import bench.console_scenarios
        import bench.queue_scenarios
        import bench.scenarios
        import bench.wakeup_load
        import bench.web_scenarios  # noqa: F401
        from bench.registry import SCENARIOS, Context, Measured, Row, result_rows, run, table

        if args.list:
            for item in SCENARIOS.values():
                print(f"{item.name:16} {item.description}")
            return 0
        unknown = set(args.only or []) - set(SCENARIOS)
        if unknown:
            parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
        from bench.procs import migrated_database

        migrated_database(workdir / "db.sqlite3")
        process_runs = args.runs or (1 if args.quick else 3)
        context = Context(quick=args.quick, runs=process_runs, workdir=workdir)
        chosen = [s for name, s in SCENARIOS.items() if not args.only or name in args.only]
        results: list[tuple[str, list[Row]]] = []
        for item in chosen:
            print(f"running {item.name}: {item.description}", file=sys.stderr, flush=True)
            if isinstance(item, Measured):
                rows = item.measure(context)
            else:
                rows = result_rows(run(item, quick=args.quick, runs=args.runs or 5))
            results.append((item.name, rows))
            # Each scenario's figures as soon as it ends: a later scenario that
            # fails (or a long run cut short) does not take them with it.
            print(table([(item.name, rows)]), flush=True)
        return 0 if all(row.ok for _, rows in results for row in rows) else 1
    finally:
        server.stop()
        # Databases and logs of every run: hundreds of MB after a full bench.
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
