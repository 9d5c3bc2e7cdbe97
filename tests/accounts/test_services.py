from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.db import transaction

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
