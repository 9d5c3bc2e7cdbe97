"""gunicorn entry for the signup benchmark: ``bench.wsgi:application``.

``BENCH_SIGNUP_ENQUEUE=0`` replaces the welcome email's ``send`` with a no-op
in this process only, so the same view is measured with and without the
enqueue and no production code needs a switch for it.
"""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
application = get_wsgi_application()

if os.environ.get("BENCH_SIGNUP_ENQUEUE", "1") == "0":
    from accounts.tasks import send_welcome_email

    def _no_enqueue(*args: object, **kwargs: object) -> None:
        return None

    setattr(send_welcome_email, "send", _no_enqueue)  # noqa: B010 - instance override, bench only
