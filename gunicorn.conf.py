"""gunicorn settings: picked up by ``gunicorn project.wsgi`` from the working directory."""

from __future__ import annotations

import os
from typing import Any

bind = os.environ.get("GUNICORN_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
accesslog = "-"
# One request a line, as JSON when the app logs JSON (LOG_FORMAT, default json with
# DEBUG off): the access line goes through the app's own formatter, so a
# user agent with quotes in it cannot break the line.
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(L)ss "%(a)s"'
_debug = os.environ.get("DJANGO_DEBUG", "1").strip().lower() in {"1", "true", "yes", "on"}
_json = os.environ.get("LOG_FORMAT", "plain" if _debug else "json") == "json"
# Both modes go through the app's RedactFilter: a request line carries its query
# string ("GET /callback?token=..."), which must not reach the log as it came.
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact": {"()": "jobs.observability.logredaction.RedactFilter"}},
    "formatters": {
        "json": {"()": "jobs.observability.logcontext.JsonFormatter"},
        "plain_access": {"format": "%(message)s"},
        "plain_error": {"format": "%(asctime)s [%(process)d] [%(levelname)s] %(message)s"},
    },
    "handlers": {
        "access": {
            "class": "logging.StreamHandler",
            "formatter": "json" if _json else "plain_access",
            "filters": ["redact"],
            "stream": "ext://sys.stdout",
        },
        "error": {
            "class": "logging.StreamHandler",
            "formatter": "json" if _json else "plain_error",
            "filters": ["redact"],
            "stream": "ext://sys.stderr",
        },
    },
    # gunicorn merges this over its defaults key by key: "root" must name ours.
    "root": {"handlers": ["error"], "level": "INFO"},
    "loggers": {
        "gunicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
        "gunicorn.error": {"handlers": ["error"], "level": "INFO", "propagate": False},
    },
}


def child_exit(server: Any, worker: Any) -> None:
    # Prometheus multiprocess mode: drop a dead worker's live gauges.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        from jobs.observability.metrics import process_identifier

        multiprocess.mark_process_dead(process_identifier(worker.pid))  # type: ignore[no-untyped-call]
