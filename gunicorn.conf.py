"""gunicorn settings: picked up by ``gunicorn project.wsgi`` from the working directory."""

from __future__ import annotations

import os
from typing import Any

bind = os.environ.get("GUNICORN_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
accesslog = "-"


def child_exit(server: Any, worker: Any) -> None:
    # Prometheus multiprocess mode: drop a dead worker's live gauges.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        from jobs.observability.metrics import process_identifier

        multiprocess.mark_process_dead(process_identifier(worker.pid))  # type: ignore[no-untyped-call]
