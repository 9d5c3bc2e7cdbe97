from __future__ import annotations

from django.apps import AppConfig
from django.core import checks
from django.utils.module_loading import autodiscover_modules


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from jobs.checks import check_lock_ttls, check_references

        checks.register(check_lock_ttls, "jobs")
        checks.register(check_references, "jobs")
        # Every process (web included) registers every app's actors, so the admin
        # can list them, retry them and show the periodic ones.
        autodiscover_modules("tasks")
        from jobs.tasks_framework.backend import declare_pending_tasks

        # Django tasks imported before the broker existed get their actors now.
        declare_pending_tasks()
