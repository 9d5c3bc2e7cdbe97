"""A signed-up user logs back in, sees their account and downloads their export."""

from __future__ import annotations

import json
from types import SimpleNamespace

import dramatiq
import pytest
from django.contrib.auth.models import User
from django.test import Client

from accounts import ratelimit
from tests.accounts.test_export import login, post_export, run_exports

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"


@pytest.fixture
def ada() -> User:
    return User.objects.create_user("ada", "ada@example.com", PASSWORD)


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    # Half a second into a window: a pause of the machine cannot split the attempts.
    monkeypatch.setattr(ratelimit, "time", SimpleNamespace(time=lambda: 2_000_000_000.5))


def attempt(client: Client, username: str, password: str, ip: str = "10.0.0.1") -> int:
    response = client.post(
        "/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=ip
    )
    return response.status_code


def test_the_login_page_is_a_form_with_a_csrf_token(client: Client) -> None:
    html = client.get("/accounts/login/").content.decode()
    for name in ("username", "password", "csrfmiddlewaretoken"):
        assert f'name="{name}"' in html


def test_a_user_logs_in_and_lands_on_their_account(client: Client, ada: User) -> None:
    response = client.post("/accounts/login/", {"username": "ada", "password": PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == "/accounts/"
    page = client.get("/accounts/").content.decode()
    assert "ada@example.com" in page
    assert "Export my data" in page


def test_a_wrong_password_is_a_form_error(client: Client, ada: User) -> None:
    response = client.post("/accounts/login/", {"username": "ada", "password": "nope"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()


def test_the_account_page_asks_a_stranger_to_log_in(client: Client) -> None:
    response = client.get("/accounts/")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/accounts/"


def test_logout_ends_the_session(client: Client, ada: User) -> None:
    client.force_login(ada)
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/accounts/").status_code == 302


def test_the_signup_done_page_links_to_the_login(client: Client) -> None:
    assert 'href="/accounts/login/"' in client.get("/accounts/signup/done/").content.decode()


def test_guessing_a_password_is_throttled_per_address_and_name(
    client: Client, ada: User, settings, frozen_clock: None
) -> None:
    # Given the shipped budget of 10 attempts a minute
    assert settings.LOGIN_RATE_LIMIT.requests == 10
    # When one address guesses ada's password 10 times, the 11th is turned away
    assert [attempt(client, "ada", f"guess{n}") for n in range(10)] == [200] * 10
    assert attempt(client, "ada", PASSWORD) == 429
    # Then ada, from her own address, still logs in: the guesser cannot lock her out
    assert attempt(client, "ada", PASSWORD, ip="10.0.0.2") == 302


def test_one_address_cannot_try_every_name(client: Client, frozen_clock: None) -> None:
    # Five times the per-name budget per address, whatever the names
    statuses = [attempt(client, f"user{n}", "guess") for n in range(51)]
    assert statuses[:50] == [200] * 50
    assert statuses[50] == 429


def test_the_admin_login_is_throttled_too(client: Client, frozen_clock: None) -> None:
    User.objects.create_superuser("root", "root@example.com", PASSWORD)
    for n in range(10):
        response = client.post("/admin/login/", {"username": "root", "password": f"g{n}"})
        assert response.status_code == 200
    response = client.post("/admin/login/", {"username": "root", "password": PASSWORD})
    assert response.status_code == 429
    assert response["Retry-After"]


def test_the_export_downloads_as_a_json_file_once_finished(
    broker: dramatiq.Broker, ada: User
) -> None:
    client = login(ada)
    task_id = post_export(client, ada.pk).json()["data"]["id"]
    url = f"/api/tasks/{task_id}/download/"
    assert client.get(url).status_code == 409  # not run yet
    run_exports(broker)

    response = client.get(url)

    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="user_export-{task_id}.json"'
    assert json.loads(response.content)["email"] == "ada@example.com"
    # Nobody else's to read, and not for strangers
    other = User.objects.create_user("bob", "bob@example.com", PASSWORD)
    assert login(other).get(url).status_code == 404
    assert Client().get(url).status_code == 401


def test_variants_of_a_name_share_its_budget(client: Client, ada: User, frozen_clock: None) -> None:
    # The login form strips and NFKC-normalises the name: each variant is ada.
    assert [attempt(client, "ada", f"guess{n}") for n in range(10)] == [200] * 10
    for variant in (" ada", "\tada", "\u3000ada", "\uff41da"):
        assert attempt(client, variant, PASSWORD) == 429, variant
