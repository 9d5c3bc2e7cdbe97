"""Writes of the accounts app. Views call these; these own transactions and enqueues."""

from __future__ import annotations

import logging
import smtplib
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.mail import EmailMultiAlternatives
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string

from accounts import metrics
from accounts.models import TaskRequest
from jobs.consistency.idempotency import run_once
from jobs.consistency.locks import redis_lock
from jobs.consistency.outbox import send_on_commit
from jobs.errors import PermanentJobError
from jobs.runtime import progress

logger = logging.getLogger(__name__)
User = get_user_model()


class RegistrationConflict(Exception):
    """A unique field was taken by a concurrent signup after validation passed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def user_register(*, username: str, email: str, password: str) -> AbstractBaseUser:
    """Create the user and, once the transaction commits, enqueue the welcome email.

    The message carries only the user id: never the password or the address, so
    the worker reads current data and no secret sits in Redis.
    """
    from accounts.tasks import send_welcome_email  # tasks import services too

    # Hash before the transaction: PBKDF2 takes 0.2 s of CPU, 0.5 s on a loaded
    # machine, and on SQLite a transaction holds the database's only write lock
    # from BEGIN IMMEDIATE. Hashed inside, four concurrent signups held it 94% of
    # the time and a worker's write waited out the 30 s busy timeout ("database
    # is locked"). Built as create_user() builds it: the same checks and
    # normalisation, the hash assigned (set_password would also run validators'
    # password_changed() hooks at save, inside the transaction).
    if not username:
        raise ValueError("The given username must be set")
    user = User(
        username=User.normalize_username(username), email=User.objects.normalize_email(email)
    )
    user.password = make_password(password)
    try:
        with transaction.atomic():
            user.save(force_insert=True)
            user_id = user.pk
            # Written with the user: if the broker is down at commit, the outbox
            # relay publishes it later; a rollback leaves nothing behind.
            send_on_commit(send_welcome_email, user_id)
            transaction.on_commit(metrics.SIGNUPS.inc)
    except IntegrityError as exc:
        # The first line names the constraint; PostgreSQL's DETAIL line quotes
        # the values ("Key (username)=(email_fan)").
        field = "email" if "email" in str(exc).splitlines()[0].lower() else "username"
        raise RegistrationConflict(field, f"A user with that {field} already exists.") from exc
    logger.info("Registered user %s", user_id)
    return user


def welcome_email_send(*, user_id: int) -> bool:
    """Send the welcome email to ``user_id`` once; True if it was sent now."""
    try:
        user = User.objects.get(pk=user_id)
    except User.DoesNotExist:
        raise PermanentJobError(f"user {user_id} does not exist") from None
    email = getattr(user, "email", "")
    try:
        validate_email(email)
    except ValidationError:
        raise PermanentJobError(f"user {user_id} has an invalid email address") from None

    context = {"user": user, "site_url": settings.SITE_URL}
    message = EmailMultiAlternatives(
        subject="Welcome aboard",
        body=render_to_string("emails/welcome.txt", context),
        to=[email],
    )
    message.attach_alternative(render_to_string("emails/welcome.html", context), "text/html")
    sent = run_once(f"welcome-email:{user_id}", lambda: _deliver(message))
    logger.info("Welcome email %s for user %s", "sent" if sent else "already sent", user_id)
    return sent


def _deliver(message: EmailMultiAlternatives) -> None:
    """Send, turning refusals that no retry can fix into permanent failures."""
    try:
        message.send()
    except smtplib.SMTPRecipientsRefused as exc:
        raise PermanentJobError(f"recipient refused: {exc.recipients}") from exc
    except smtplib.SMTPResponseException as exc:
        if 500 <= exc.smtp_code < 600:
            raise PermanentJobError(f"mail server refused: {exc.smtp_code}") from exc
        raise  # 4xx: the server asks us to try again later


# Past this, an export waiting for the same account's previous one is retried.
EXPORT_LOCK_WAIT_S = 30


def user_export_build(*, user_id: int) -> dict[str, Any]:
    """What we hold about ``user_id``, as JSON: the result of an export task."""
    # Shown on the account page and at /api/tasks/<id>/ (outside a job: nothing).
    progress.report(0, 2, "starting")
    # One export of an account at a time, on any worker: a second one waits
    # here (its page says "starting") instead of reading the account alongside.
    with redis_lock(f"user-export:{user_id}", ttl=60, wait=EXPORT_LOCK_WAIT_S):
        progress.report(0, 2, "reading the account")
        try:
            user = User.objects.get(pk=user_id)
        except User.DoesNotExist:
            raise PermanentJobError(f"user {user_id} does not exist") from None
    progress.report(1, 2, "writing the export")
    joined = getattr(user, "date_joined", None)
    last_login = user.last_login
    export = {
        "id": user.pk,
        "username": user.get_username(),
        "email": getattr(user, "email", ""),
        "first_name": getattr(user, "first_name", ""),
        "last_name": getattr(user, "last_name", ""),
        "date_joined": joined.isoformat() if joined is not None else None,
        "last_login": last_login.isoformat() if last_login is not None else None,
    }
    progress.report(2, 2, "done")
    return export


def user_export_request(*, requested_by: AbstractBaseUser, user_id: int) -> str:
    """Enqueue an export of ``user_id`` for ``requested_by``; the task id to poll.

    The request record and the task's outbox row commit together: the requester
    can read the result exactly when the task exists.
    """
    from accounts.tasks import user_export

    with transaction.atomic():
        result = user_export.enqueue(user_id)
        TaskRequest.objects.create(task_id=result.id, requested_by_id=requested_by.pk)
    logger.info("Export of user %s for user %s: task %s", user_id, requested_by.pk, result.id)
    return result.id
