from __future__ import annotations

import json

import pytest
from django.contrib.auth.hashers import MD5PasswordHasher
from django.contrib.auth.models import User
from django.db import connection, transaction
from pytest_django.fixtures import Settings

from accounts.services import RegistrationConflict, user_register
from tests.conftest import queued_messages


class Boom(Exception):
    pass


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_enqueues_nothing() -> None:
    def register_then_fail() -> None:
        with transaction.atomic():
            user_register(username="ada", email="ada@example.com", password="correct-horse-1")
            raise Boom

    with pytest.raises(Boom):
        register_then_fail()

    assert not User.objects.exists()
    assert queued_messages("emails") == []


@pytest.mark.django_db(transaction=True)
def test_a_committed_transaction_enqueues_exactly_one_message_without_secrets() -> None:
    user = user_register(username="ada", email="ada@example.com", password="correct-horse-1")

    messages = queued_messages("emails")
    assert [(m.actor_name, m.args, m.kwargs) for m in messages] == [
        ("send_welcome_email", (user.pk,), {})
    ]
    encoded = json.dumps([m.asdict() for m in messages])
    assert "correct-horse-1" not in encoded
    assert "ada@example.com" not in encoded


@pytest.mark.django_db(transaction=True)
def test_the_message_waits_for_the_outer_transaction_to_commit() -> None:
    with transaction.atomic():
        user_register(username="ada", email="ada@example.com", password="correct-horse-1")
        assert queued_messages("emails") == []
    assert len(queued_messages("emails")) == 1


@pytest.mark.django_db(transaction=True)
def test_it_turns_a_unique_race_into_a_field_conflict() -> None:
    # The form check passed for both requests; the database settles who wins.
    user_register(username="ada", email="ada@example.com", password="correct-horse-1")

    with pytest.raises(RegistrationConflict) as username_taken:
        user_register(username="ada", email="other@example.com", password="correct-horse-1")
    with pytest.raises(RegistrationConflict) as email_taken:
        user_register(username="bob", email="ADA@example.com", password="correct-horse-1")

    assert username_taken.value.field == "username"
    assert email_taken.value.field == "email"
    assert User.objects.count() == 1
    assert len(queued_messages("emails")) == 1


class TransactionProbingHasher(MD5PasswordHasher):
    """Notes, at each hash, whether a transaction was open on this thread."""

    in_transaction: list[bool] = []

    def encode(self, password: str, salt: str) -> str:
        self.in_transaction.append(connection.in_atomic_block)
        return super().encode(password, salt)


@pytest.mark.django_db(transaction=True)
def test_the_password_is_hashed_before_the_transaction_opens(settings: Settings) -> None:
    # The shipped PBKDF2 takes 0.2-0.5 s of CPU. On SQLite a transaction holds
    # the database's one write lock from its BEGIN IMMEDIATE: hashed inside it,
    # four concurrent signups held the lock 94% of the time and a worker's write
    # waited out the busy timeout ("database is locked"). This test swaps in a
    # hasher that records whether it ran inside a transaction.
    settings.PASSWORD_HASHERS = [f"{__name__}.TransactionProbingHasher"]
    TransactionProbingHasher.in_transaction.clear()

    user = user_register(username="ada", email="ada@EXAMPLE.com", password="correct-horse-1")

    assert TransactionProbingHasher.in_transaction == [False]
    stored = User.objects.get(pk=user.pk)
    assert stored.check_password("correct-horse-1")
    assert stored.email == "ada@example.com"  # normalised as create_user() does


class RecordingValidator:
    """A password validator that notes whether its password_changed() hook ran
    inside a transaction (a validator may do real work there)."""

    inside: list[bool] = []

    def validate(self, password: str, user: object = None) -> None:
        pass

    def password_changed(self, password: str, user: object = None) -> None:
        self.inside.append(connection.in_atomic_block)


@pytest.mark.django_db(transaction=True)
def test_no_password_hook_runs_inside_the_signup_transaction(settings: Settings) -> None:
    settings.AUTH_PASSWORD_VALIDATORS = [{"NAME": f"{__name__}.RecordingValidator"}]
    RecordingValidator.inside.clear()

    user_register(username="ada", email="ada@example.com", password="correct-horse-1")

    assert True not in RecordingValidator.inside


@pytest.mark.django_db(transaction=True)
def test_an_empty_username_is_refused_as_create_user_refuses_it() -> None:
    with pytest.raises(ValueError, match="username must be set"):
        user_register(username="", email="ada@example.com", password="correct-horse-1")
    assert not User.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_username_conflict_is_the_usernames_even_when_the_name_says_email() -> None:
    # PostgreSQL's error quotes the values on its DETAIL line: "Key
    # (username)=(email_fan)" made the username's conflict read as the email's.
    user_register(username="email_fan", email="fan@example.com", password="correct-horse-1")

    with pytest.raises(RegistrationConflict) as taken:
        user_register(username="email_fan", email="other@example.com", password="correct-horse-1")

    assert taken.value.field == "username"
