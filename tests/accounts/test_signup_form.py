from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.conftest import queued_messages

VALID = {
    "username": "ada",
    "email": "ada@example.com",
    "password1": "correct-horse-battery",
    "password2": "correct-horse-battery",
}


@pytest.mark.django_db
def test_it_renders_the_form_with_labels_and_csrf(client: Client) -> None:
    response = client.get("/accounts/signup/")
    assert response.status_code == 200
    html = response.content.decode()
    for field in ("username", "email", "password1", "password2"):
        assert f'name="{field}"' in html
        assert f'for="id_{field}"' in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert 'name="viewport"' in html


@pytest.mark.django_db(transaction=True)
def test_it_creates_the_user_redirects_and_enqueues_one_email(client: Client) -> None:
    response = client.post("/accounts/signup/", VALID)

    assert response.status_code == 302
    assert response["Location"] == "/accounts/signup/done/"
    user = User.objects.get(username="ada")
    assert user.email == "ada@example.com"
    assert user.check_password("correct-horse-battery")
    messages = queued_messages("emails")
    assert [(m.actor_name, m.args) for m in messages] == [("send_welcome_email", (user.pk,))]

    done = client.get(response["Location"])
    assert "Check your inbox" in done.content.decode()
    assert "ada@example.com" in done.content.decode()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"username": ""}, "username"),
        ({"username": "bad name!"}, "username"),
        ({"email": "not-an-email"}, "email"),
        ({"email": ""}, "email"),
        ({"password2": "something-else-entirely"}, "password2"),
        ({"password1": "123", "password2": "123"}, "password2"),
        ({"password1": "password", "password2": "password"}, "password2"),
    ],
)
@pytest.mark.django_db(transaction=True)
def test_it_rerenders_invalid_input_with_field_errors(
    client: Client, change: dict[str, str], field: str
) -> None:
    response = client.post("/accounts/signup/", {**VALID, **change})

    assert response.status_code == 200
    assert response.context["form"].errors[field]
    assert f'id="id_{field}_errors"' in response.content.decode()
    assert not User.objects.exists()
    assert queued_messages("emails") == []


@pytest.mark.django_db(transaction=True)
def test_it_reports_a_taken_username_and_email_as_field_errors(client: Client) -> None:
    User.objects.create_user("ada", "ADA@example.com", "x")

    response = client.post("/accounts/signup/", VALID)

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert "username" in errors
    assert errors["email"] == ["A user with that email already exists."]


@pytest.mark.django_db
def test_it_refuses_a_post_without_csrf_token() -> None:
    client = Client(enforce_csrf_checks=True)
    response = client.post("/accounts/signup/", VALID)
    assert response.status_code == 403
    assert not User.objects.exists()


@pytest.mark.django_db
def test_a_huge_form_body_is_a_400_not_a_500(client: Client, settings) -> None:
    huge = {**VALID, "username": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)}
    response = client.post("/accounts/signup/", huge)
    assert response.status_code == 400
    assert not User.objects.exists()


@pytest.mark.django_db
def test_an_empty_post_shows_every_required_field(client: Client) -> None:
    response = client.post("/accounts/signup/", {})
    assert response.status_code == 200
    assert set(response.context["form"].errors) == {"username", "email", "password1", "password2"}
