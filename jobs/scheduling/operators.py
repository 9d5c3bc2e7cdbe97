"""Mail to the people who run the platform: the daily report and watchdog alerts.

Their own recipients (``JOBS_MAIL_RECIPIENTS``, by default the addresses of
``ADMINS``), so a project can keep ``ADMINS`` empty (no 500 emails) and still
get its report; check ``jobs.W004`` warns when neither names anyone.
"""

from __future__ import annotations

from django.conf import settings
from django.core.mail import EmailMultiAlternatives

from jobs.conf import jobs_settings


def mail_operators(subject: str, body: str, *, html: str | None = None) -> bool:
    """Send to ``JOBS_MAIL_RECIPIENTS``; False when there is no one to send to."""
    recipients = list(jobs_settings.JOBS_MAIL_RECIPIENTS)
    if not recipients:
        return False
    message = EmailMultiAlternatives(
        f"{settings.EMAIL_SUBJECT_PREFIX}{subject}",
        body,
        settings.SERVER_EMAIL,
        recipients,
    )
    if html is not None:
        message.attach_alternative(html, "text/html")
    message.send()
    return True
