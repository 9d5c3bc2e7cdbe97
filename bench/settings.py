"""Bench settings: the project's settings plus the knobs the benchmarks turn.

    JOBS_INSTANT_WAKEUP=0        the stock polling consumer (jobs.broker.wakeup)
    BENCH_ADMIN_MIDDLEWARE=1     django-dramatiq's AdminMiddleware (its Task model)
                                 in place of our ledger, for comparison
Passwords use MD5 so signup figures measure the queue path, not PBKDF2
(181 ms per signup on the reference machine).
"""

from __future__ import annotations

from project.env import env_bool
from project.settings import *  # noqa: F403
from project.settings import DRAMATIQ_BROKER

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

_middleware = list(DRAMATIQ_BROKER["MIDDLEWARE"])
if env_bool("BENCH_ADMIN_MIDDLEWARE", False):
    # Our Ledger stays installed (the stack sets JOBS_LEDGER_ENABLED=0, so it
    # writes nothing): it declares actor options the product's actors use
    # (refers_to), without which importing them fails. Its baseline, "ledger
    # off", has the same disabled middleware.
    _middleware.append("django_dramatiq.middleware.AdminMiddleware")

DRAMATIQ_BROKER = {
    **DRAMATIQ_BROKER,
    "BROKER": "jobs.broker.wakeup.WakeupRedisBroker",
    "OPTIONS": {
        **DRAMATIQ_BROKER["OPTIONS"],
        "instant_wakeup": env_bool("JOBS_INSTANT_WAKEUP", True),
    },
    "MIDDLEWARE": _middleware,
}
