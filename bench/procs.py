"""Processes the bench starts: migrated SQLite files, worker and gunicorn subprocesses."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dramatiq

from jobs.broker.wakeup import WakeupRedisBroker

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
DRAMATIQ = str(Path(sys.executable).parent / "dramatiq")
QUEUE = "bench"
_SECRET_KEY = secrets.token_urlsafe(50)  # DEBUG off refuses the insecure development key
# bench.worker_app's probe actor pushes [sent_at, started_at] here.
STARTED_KEY = "bench:started"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def base_env(**extra: str) -> dict[str, str]:
    """The bench process's environment (REDIS_URL, DATABASE_URL, ...) plus ``extra``."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "LOG_LEVEL": "WARNING"}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    env.update(extra)
    return env


def manage(*args: str, env: Mapping[str, str]) -> str:
    done = subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def migrated_database(path: Path) -> Path:
    """A fresh SQLite file with every migration applied (copy it for each run)."""
    manage("migrate", "--noinput", env=base_env(DATABASE_URL=f"sqlite:///{path}"))
    return path


def template_database(workdir: Path) -> Path:
    """One migrated file per bench run, never opened by the bench process itself."""
    path = workdir / "template.sqlite3"
    return path if path.exists() else migrated_database(path)


def copy_database(template: Path, target: Path) -> str:
    for suffix in ("-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(template, target)
    return f"sqlite:///{target}"


@contextmanager
def workers(
    *, processes: int, threads: int, env: Mapping[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """``dramatiq bench.worker_app`` with the given worker settings; stopped gracefully."""
    command = [
        DRAMATIQ,
        "bench.worker_app",
        "--processes",
        str(processes),
        "--threads",
        str(threads),
        "--queues",
        "bench",
    ]
    # Production's DEBUG (off) for workers: with it on, Django keeps a log of
    # every SQL statement. (Web scenarios keep the default: DEBUG off would need
    # collectstatic for the admin's pages.)
    env = {"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": _SECRET_KEY, **env}
    with open(log, "ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=dict(env), stdout=out, stderr=out)
    try:
        yield process
    finally:
        stop(process)


@contextmanager
def gunicorn(*, port: int, env: Mapping[str, str], log: Path) -> Iterator[None]:
    command = [
        str(Path(sys.executable).parent / "gunicorn"),
        "bench.wsgi:application",
        "--workers",
        "2",
        "--bind",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
    ]
    # Production's DEBUG (off) for workers: with it on, Django keeps a log of
    # every SQL statement. (Web scenarios keep the default: DEBUG off would need
    # collectstatic for the admin's pages.)
    env = {"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": _SECRET_KEY, **env}
    with open(log, "ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=dict(env), stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gunicorn did not start; see {log}") from None
                time.sleep(0.05)
        yield
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def bench_message(
    *args: Any, options: dict[str, Any] | None = None, actor_name: str = "noop"
) -> dramatiq.Message[Any]:
    return dramatiq.Message(
        queue_name=QUEUE, actor_name=actor_name, args=args, kwargs={}, options=dict(options or {})
    )


def enqueue_pipelined(
    broker: WakeupRedisBroker, messages: Iterable[dramatiq.Message[Any]], *, per_trip: int = 500
) -> None:
    """Enqueue through Dramatiq's dispatch script, one round trip per ``per_trip`` messages.

    Bypasses broker middleware on purpose: it fills queues for the worker
    benchmarks the same way for every variant. With ``instant_wakeup`` off
    this is exactly what a stock RedisBroker sends.
    """
    script = broker.scripts["dispatch"]
    broker.client.script_load(script.script)  # EVALSHA below needs it cached
    pipe = broker.client.pipeline(transaction=False)
    pending = 0
    for message in messages:
        redis_id = str(message.message_id)
        message = message.copy(options={"redis_message_id": redis_id})
        args = broker._dispatch_args("enqueue", message.queue_name, redis_id, message.encode())
        pipe.evalsha(script.sha, 1, broker.namespace, *args)
        pending += 1
        if pending == per_trip:
            _execute(broker, pipe, pending)
            pending = 0
    if pending:
        _execute(broker, pipe, pending)


def _execute(broker: WakeupRedisBroker, pipe: Any, count: int) -> None:
    if broker.instant_wakeup:
        # One batch of tokens per round trip (the list holds at most 64 anyway).
        broker._push_tokens(pipe, "bench", count)
    pipe.execute()
