"""A NUL character in a URL is a 400 on every database (PostgreSQL made it a 500)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.fixture
def root() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.mark.parametrize(
    "url",
    [
        "/api/tasks/%00/",
        "/admin/jobs/job/?subject=%00",
        "/admin/jobs/job/?actor=a%00b",
        "/admin/jobs/job/?queue=%00",
        "/admin/jobs/job/?state=%00",
        "/admin/jobs/job/?q=%00",
        "/admin/jobs/job/?%00=1",
    ],
)
def test_a_nul_in_a_url_is_a_400(root: Client, url: str) -> None:
    assert root.get(url).status_code == 400


def test_the_admin_refuses_a_nul_filter_without_the_middleware(root: Client, settings) -> None:
    # An adopting project may not list the middleware: the platform's admin guards itself.
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if m != "jobs.http.nul.RejectNulMiddleware"
    ]
    response = root.get("/admin/jobs/job/?actor=%00")
    assert response.status_code == 400


def test_a_nul_in_a_cookie_is_a_400() -> None:
    client = Client()
    client.cookies["sessionid"] = "\x00abcdefgh"
    assert client.get("/accounts/login/").status_code == 400
