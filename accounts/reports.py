"""The product's figures in the platform's daily report."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth import get_user_model

from jobs.scheduling.reports import report_section


@report_section("signups", "New signups")
def signups(start: datetime, end: datetime) -> int:
    return get_user_model().objects.filter(date_joined__gte=start, date_joined__lt=end).count()
