"""Error emails carry no credential and do not come one per anonymous request."""

from __future__ import annotations

import logging

import django
import pytest
from django.core import mail
from django.test import Client

from jobs.observability.errorreports import ThrottledAdminEmailHandler

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.jobs.observability.boom_urls")]


@pytest.fixture
def production(settings) -> ThrottledAdminEmailHandler:
    """DEBUG off, an admin to mail, credentials in URL settings as production has them."""
    settings.DEBUG = False
    # Plain addresses from Django 6.0 on (pairs warn there), pairs before.
    settings.ADMINS = (
        ["ops@example.com"] if django.VERSION >= (6, 0) else [("Ops", "ops@example.com")]
    )
    settings.REDIS_URL = "redis://:redis-secret@10.0.0.5:6379/0"
    settings.DATABASE_URL = "postgres://app:db-secret@10.0.0.6/app"
    [handler] = [
        h for h in logging.getLogger("django").handlers if isinstance(h, ThrottledAdminEmailHandler)
    ]
    # The handler lives as long as the process: each test starts with no history.
    handler._last_by_kind.clear()
    handler._sent.clear()
    handler._held = 0
    return handler


def test_an_error_email_masks_passwords_in_urls_locals_and_meta(production) -> None:
    client = Client(raise_request_exception=False)
    response = client.get("/boom/", HTTP_X_UPSTREAM="https://user:meta-secret@proxy/")
    assert response.status_code == 500
    [email] = mail.outbox
    body = email.body + "".join(str(a[0]) for a in getattr(email, "alternatives", []))
    assert "RuntimeError" in body
    for secret in ("redis-secret", "db-secret", "frame-secret", "meta-secret"):
        assert secret not in body, secret
    # Shown masked, so the operator still sees which host it was
    assert "10.0.0.5:6379" in body


def test_an_error_email_masks_the_query_string_and_every_cookie(production) -> None:
    client = Client(raise_request_exception=False)
    client.cookies["sessionid"] = "session-secret-value"
    response = client.get("/boom/?token=query-secret&page=2&next=https://u:url-secret@h/")
    assert response.status_code == 500
    [email] = mail.outbox
    body = email.body + "".join(str(a[0]) for a in getattr(email, "alternatives", []))
    for secret in ("query-secret", "url-secret", "session-secret-value"):
        assert secret not in body, secret
    assert "page" in body  # the rest of the query string is still there


def test_a_flood_of_the_same_error_sends_one_email(production) -> None:
    client = Client(raise_request_exception=False)
    for _ in range(100):
        assert client.get("/boom/").status_code == 500
    assert len(mail.outbox) == 1


def test_bad_host_headers_are_not_mailed(production) -> None:
    client = Client()
    for n in range(40):
        assert client.get("/boom/", HTTP_HOST=f"evil{n}.example").status_code == 400
    assert mail.outbox == []


def test_the_handler_counts_what_it_held_back_in_its_next_email(production) -> None:
    production.window_s = 0
    production.per_hour = 2
    client = Client(raise_request_exception=False)
    for _ in range(5):
        client.get("/boom/")
    assert len(mail.outbox) == 2
    production.per_hour = 3
    client.get("/boom/")
    assert "3 error email(s) held back" in mail.outbox[-1].subject


def test_a_report_never_runs_a_querysets_query_again() -> None:
    # repr() of a QuerySet queries the database: in a report about a database
    # error it raised again and the email was lost.
    from django.contrib.auth.models import User

    from jobs.observability.errorreports import _mask

    queryset = User.objects.all()
    assert _mask(queryset) is queryset
    assert _mask({"url": "redis://:pw-12345@h/0"}) == {"url": "redis://:[redacted]@h/0"}


def test_an_error_logged_outside_a_request_is_mailed_not_raised(production) -> None:
    # A worker or a command logging an error on a django.* logger: no request,
    # and Django's own filter guards that; ours read request.COOKIES and raised
    # from inside the logging call (send_robust raised, a task's failure retried).
    try:
        raise ValueError("outside a request with redis://:in-text-secret@10.0.0.5/0")
    except ValueError:
        logging.getLogger("django.tasks").error("Task failed", exc_info=True)

    [email] = mail.outbox
    assert "ValueError" in email.body
    assert "in-text-secret" not in email.body
