from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.conftest import queued_messages

VALID = {"username": "grace", "email": "grace@example.com", "password": "correct-horse-battery"}


def post(
    client: Client, body: object, content_type: str = "application/json"
) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    response = client.post("/api/signup/", data=data, content_type=content_type)
    return response.status_code, response.json()


@pytest.mark.django_db(transaction=True)
def test_it_creates_the_user_and_returns_201(client: Client) -> None:
    status, body = post(client, VALID)

    assert status == 201
    user = User.objects.get(username="grace")
    assert body == {"data": {"id": user.pk, "username": "grace", "email": "grace@example.com"}}
    messages = queued_messages("emails")
    assert [(m.actor_name, m.args) for m in messages] == [("send_welcome_email", (user.pk,))]
    assert "correct-horse-battery" not in json.dumps([m.asdict() for m in messages])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"username": ""}, "username"),
        ({"email": "nope"}, "email"),
        ({"password": "short"}, "password"),
        ({"password": "grace-example"}, "password"),  # too similar to the username
        ({"password": "12345678901"}, "password"),
        ({"username": 5}, "username"),
        ({"email": None}, "email"),
        ({"password": ["a", "b"]}, "password"),
    ],
)
@pytest.mark.django_db(transaction=True)
def test_it_returns_400_with_field_messages(
    client: Client, change: dict[str, object], field: str
) -> None:
    status, body = post(client, {**VALID, **change})

    assert status == 400
    assert body["errors"][field]
    assert all(isinstance(m, str) and m for m in body["errors"][field])
    assert not User.objects.exists()
    assert queued_messages("emails") == []


@pytest.mark.django_db(transaction=True)
def test_it_reports_each_missing_field(client: Client) -> None:
    status, body = post(client, {})
    assert status == 400
    assert set(body["errors"]) == {"username", "email", "password"}


@pytest.mark.django_db(transaction=True)
def test_it_reports_duplicates_as_field_errors(client: Client) -> None:
    assert post(client, VALID)[0] == 201

    status, body = post(client, {**VALID, "email": "GRACE@example.com", "username": "grace"})

    assert status == 400
    assert body["errors"]["username"] == ["A user with that username already exists."]
    assert body["errors"]["email"] == ["A user with that email already exists."]
    assert len(queued_messages("emails")) == 1


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("{not json", "application/json"),
        (b"\xff\xfe\x00", "application/json"),
        ("[1, 2]", "application/json"),
        ("null", "application/json"),
        ("", "application/json"),
        ("username=a&email=b", "application/x-www-form-urlencoded"),
        (json.dumps(VALID), "text/plain"),
        # nested past the recursion limit: RecursionError, not a ValueError. The
        # depth that raises it differs by version (Python 3.13's json parses 1,500
        # levels), so 100,000: past it on every supported Python, 600 KB of body.
        ("[" * 100_000 + "]" * 100_000, "application/json"),
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "application/json"),
    ],
)
@pytest.mark.django_db
def test_it_rejects_malformed_bodies_with_400(
    client: Client, body: str | bytes, content_type: str
) -> None:
    status, payload = post(client, body, content_type)
    assert status == 400
    assert payload["errors"]["body"]


@pytest.mark.django_db
def test_it_rejects_a_huge_body_with_400(client: Client, settings) -> None:
    huge = {**VALID, "username": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)}
    status, payload = post(client, huge)
    assert status == 400
    assert payload["errors"]["body"] == ["Request body is too large."]


@pytest.mark.django_db
def test_it_only_accepts_post(client: Client) -> None:
    assert client.get("/api/signup/").status_code == 405
