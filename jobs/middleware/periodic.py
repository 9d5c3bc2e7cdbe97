"""periodiq's middleware, with our ``catch_up`` actor option and a settings-driven
skip delay (a periodic message older than ``JOBS_PERIODIC_SKIP_AFTER_S`` when a
worker picks it up is skipped: a stale tick is worse than none)."""

from __future__ import annotations

from periodiq import PeriodiqMiddleware

from jobs.conf import jobs_settings


class Periodic(PeriodiqMiddleware):  # type: ignore[misc]
    actor_options = {"periodic", "catch_up"}

    def __init__(self) -> None:
        super().__init__(skip_delay=jobs_settings.JOBS_PERIODIC_SKIP_AFTER_S)
