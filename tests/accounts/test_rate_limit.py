from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client

from accounts import ratelimit
from project.env import Rate

pytestmark = pytest.mark.django_db(transaction=True)


def api_signup(client: Client, n: int, **extra: Any) -> int:
    body = {"username": f"user{n}", "email": f"user{n}@example.com", "password": "correct-horse-9"}
    response = client.post("/api/signup/", body, content_type="application/json", **extra)
    return response.status_code


def test_it_answers_429_with_retry_after_past_the_limit_then_recovers(
    client: Client, settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.SIGNUP_RATE_LIMIT = Rate(requests=3, seconds=2)
    # The limiter's clock, held half a second into a window: on the real one, a
    # pause of the machine between two requests could move one into the next window.
    now = [2_000_000_000.5]
    monkeypatch.setattr(ratelimit, "time", SimpleNamespace(time=lambda: now[0]))

    statuses = [api_signup(client, n) for n in range(4)]
    response = client.post("/api/signup/", {}, content_type="application/json")

    assert statuses == [201, 201, 201, 429]
    assert response.status_code == 429
    # Whole seconds, rounded up: the window ends 1.5 s later
    assert response["Retry-After"] == "2"
    now[0] += 1.5
    assert api_signup(client, 10) == 201


def test_the_limit_is_per_client_ip(client: Client, settings) -> None:
    settings.SIGNUP_RATE_LIMIT = Rate(requests=1, seconds=60)

    assert api_signup(client, 1, REMOTE_ADDR="10.0.0.1") == 201
    assert api_signup(client, 2, REMOTE_ADDR="10.0.0.1") == 429
    assert api_signup(client, 3, REMOTE_ADDR="10.0.0.2") == 201


def test_the_limit_is_per_email_too(client: Client, settings) -> None:
    settings.SIGNUP_RATE_LIMIT = Rate(requests=1, seconds=60)
    body = {"username": "x", "email": "same@example.com", "password": "short"}

    first = client.post(
        "/api/signup/", body, content_type="application/json", REMOTE_ADDR="10.0.0.1"
    )
    second = client.post(
        "/api/signup/", body, content_type="application/json", REMOTE_ADDR="10.0.0.2"
    )

    assert first.status_code == 400
    assert second.status_code == 429


def test_the_form_shows_the_limit_as_an_error(client: Client, settings) -> None:
    settings.SIGNUP_RATE_LIMIT = Rate(requests=1, seconds=60)
    body = {"username": "ada", "email": "ada@example.com", "password1": "a", "password2": "a"}

    client.post("/accounts/signup/", body)
    response = client.post("/accounts/signup/", body)

    assert response.status_code == 429
    assert "Too many signups" in response.content.decode()
    assert 'value="ada@example.com"' in response.content.decode()


def test_off_disables_the_limit(client: Client, settings) -> None:
    settings.SIGNUP_RATE_LIMIT = None
    assert [api_signup(client, n) for n in range(15)] == [201] * 15
