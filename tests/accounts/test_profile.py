"""The cached user profile: GET /api/users/<id>/ served through jobs.consistency.cache."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client

from jobs.consistency.cache import cache_stats

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_returns_the_profile_and_serves_the_second_read_from_the_cache(
    client: Client, django_assert_num_queries
) -> None:
    user = User.objects.create_user("ada", "ada@example.com", "pw", first_name="Ada")

    first = client.get(f"/api/users/{user.pk}/")
    with django_assert_num_queries(0):
        second = client.get(f"/api/users/{user.pk}/")

    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    data = first.json()["data"]
    assert data["id"] == user.pk
    assert data["username"] == "ada"
    assert data["first_name"] == "Ada"
    assert "password" not in data
    assert "email" not in data  # the profile is public: no private fields
    assert cache_stats()["user-profile"] == {"hits": 1, "misses": 1}


def test_it_is_fresh_after_an_update_commits_and_unchanged_after_a_rollback(
    client: Client,
) -> None:
    user = User.objects.create_user("ada", "ada@example.com", "pw", first_name="Ada")
    client.get(f"/api/users/{user.pk}/")

    with pytest.raises(RuntimeError), transaction.atomic():  # noqa: PT012
        user.first_name = "Rolled back"
        user.save()
        raise RuntimeError
    assert client.get(f"/api/users/{user.pk}/").json()["data"]["first_name"] == "Ada"

    with transaction.atomic():
        user.first_name = "Augusta"
        user.save()
    assert client.get(f"/api/users/{user.pk}/").json()["data"]["first_name"] == "Augusta"


def test_a_missing_user_is_404_until_the_user_exists(client: Client) -> None:
    missing = client.get("/api/users/4242/")
    assert missing.status_code == 404
    assert "errors" in missing.json()

    User.objects.create_user("late", "late@example.com", "pw", id=4242)

    assert client.get("/api/users/4242/").status_code == 200


def test_a_deleted_user_is_404_after_the_delete_commits(client: Client) -> None:
    user = User.objects.create_user("gone", "gone@example.com", "pw")
    assert client.get(f"/api/users/{user.pk}/").status_code == 200

    user.delete()

    assert client.get(f"/api/users/{user.pk}/").status_code == 404
