from __future__ import annotations

from django.apps import AppConfig, apps
from django.conf import settings
from django.core import checks
from django.utils.module_loading import autodiscover_modules

from jobs.conf.broker import MIDDLEWARE

# django_dramatiq builds the broker when its app is loaded, from DRAMATIQ_BROKER or
# else a RabbitMQ broker (a crash without pika, a traceback before any check can
# speak; a malformed value crashes inside django_dramatiq). Loaded before it
# ("jobs" first in INSTALLED_APPS, as the docs show), the platform puts a
# stand-in there instead, which refuses to send or consume, and check jobs.E002
# says what to set.
BROKER_SETTING: object = getattr(settings, "DRAMATIQ_BROKER", None)
BROKER_STAND_IN = not (
    isinstance(BROKER_SETTING, dict)
    and isinstance(BROKER_SETTING.get("BROKER"), str)
    and isinstance(BROKER_SETTING.get("OPTIONS", {}), dict)
    and isinstance(BROKER_SETTING.get("MIDDLEWARE", []), (list, tuple))
)
if BROKER_STAND_IN:
    # With the platform's middleware, so its actors' options still declare.
    settings.DRAMATIQ_BROKER = {
        "BROKER": "jobs.broker.unconfigured.UnconfiguredBroker",
        "MIDDLEWARE": list(MIDDLEWARE),
    }


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from jobs.observability import cancelled_logs, outages

        # Logging is configured by now (Django's LOGGING, or Dramatiq's in a worker).
        outages.install()
        cancelled_logs.install()
        if apps.is_installed("django.contrib.admin"):
            from jobs.admin.jobs import hide_stock_task_admin

            # The admin app's ready() (listed first) has run autodiscover by now.
            hide_stock_task_admin()
        from jobs.checks import check_lock_ttls, check_references
        from jobs.conf import checks as conf_checks
        from jobs.conf.migrations import check_migrations

        for check in (
            conf_checks.check_broker,
            conf_checks.check_cache,
            conf_checks.check_values,
            conf_checks.check_names,
            conf_checks.check_recipients,
            check_lock_ttls,
            check_references,
        ):
            checks.register(check, "jobs")
        checks.register(check_migrations, "jobs", checks.Tags.database)
        if conf_checks.check_broker():
            # Actors would not declare on a broker without the platform's
            # middleware (a traceback per option); the checks say what is wrong.
            return
        # Every process (web included) registers every app's actors, so the admin
        # can list them, retry them and show the periodic ones.
        autodiscover_modules("tasks")
        from jobs.tasks_framework.backend import declare_pending_tasks

        # Django tasks imported before the broker existed get their actors now.
        declare_pending_tasks()
