"""Dramatiq's TimeLimit with its default taken from ``JOBS_TIME_LIMIT_MS``."""

from __future__ import annotations

from typing import Any

from dramatiq.middleware import time_limit as stock

from jobs.conf import jobs_settings


class TimeLimit(stock.TimeLimit):
    def __init__(self, **options: Any) -> None:
        options.setdefault("time_limit", jobs_settings.JOBS_TIME_LIMIT_MS)
        super().__init__(**options)
