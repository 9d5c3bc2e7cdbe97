"""The welcome email through an authenticated STARTTLS relay, sent by a real worker process.

The relay (aiosmtpd, ``tests/accounts/smtp_relay.py``) takes mail only after
STARTTLS and AUTH, with a certificate from a CA made for the test. The worker is
configured from the environment alone, as in production, and trusts that CA
through ``SSL_CERT_FILE``: Django's SMTP backend (5.2 and 6.1) builds its TLS
context with ``ssl.create_default_context()``, which verifies the certificate
and the host name against OpenSSL's default CA file, and ``SSL_CERT_FILE``
names that file. Nothing turns verification off.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path

import pytest
from django.test import Client

from jobs.ledger import states
from jobs.models import Job
from tests.accounts.smtp_relay import HOST, CertificateAuthority, Login, SMTPRelay
from tests.conftest import wait_until
from tests.e2e.conftest import WorkerProcess, start_worker, worker_env  # noqa: F401 - fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

READY = "Worker process is ready for action."
RELAY_USER = "relay-user"


@pytest.fixture
def relay_password() -> str:
    # Random per test, so finding it in a log can only mean it leaked there.
    return f"relay-pw-{secrets.token_hex(12)}"


def relay_env(relay: SMTPRelay, *, trusted_ca: Path, password: str) -> dict[str, str]:
    """What production sets for an authenticated STARTTLS relay, plus the CA to trust."""
    return {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": HOST,
        "EMAIL_PORT": str(relay.port),
        "EMAIL_TIMEOUT": "5",
        "EMAIL_USE_TLS": "1",
        "EMAIL_HOST_USER": RELAY_USER,
        "EMAIL_HOST_PASSWORD": password,
        "SSL_CERT_FILE": str(trusted_ca),
    }


def sign_up(client: Client, username: str) -> int:
    body = {"username": username, "email": f"{username}@example.com", "password": "correct-horse-9"}
    response = client.post("/api/signup/", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    user_id: int = response.json()["data"]["id"]
    return user_id


def welcome_job(user_id: int) -> Job | None:
    return Job.objects.filter(
        actor_name="send_welcome_email", references__subject=f"auth.user:{user_id}"
    ).first()


def job_in(user_id: int, states_wanted: frozenset[str]) -> Callable[[], bool]:
    def check() -> bool:
        job = welcome_job(user_id)
        return job is not None and job.state in states_wanted

    return check


def test_it_delivers_the_welcome_email_over_verified_starttls_after_auth(
    client: Client,
    start_worker: Callable[..., WorkerProcess],  # noqa: F811 - fixture
    tmp_path: Path,
    relay_password: str,
) -> None:
    # Given a relay whose certificate the worker's CA file vouches for
    ca = CertificateAuthority.create(tmp_path / "ca")
    with SMTPRelay(ca.issue(), username=RELAY_USER, password=relay_password) as relay:
        worker = start_worker(relay_env(relay, trusted_ca=ca.cert, password=relay_password))
        worker.wait_for_log(READY)

        # When someone signs up
        user_id = sign_up(client, "ada")

        # Then the relay receives the welcome email once, over TLS, after AUTH
        wait_until(job_in(user_id, states.TERMINAL_STATES), timeout=20, every=0.05)
        connections, handshakes, logins, deliveries = relay.snapshot()

    job = welcome_job(user_id)
    assert job is not None
    assert (job.state, job.error_type) == (states.SUCCEEDED, "")
    assert logins == [Login(RELAY_USER, over_tls=True, accepted=True)]
    assert (connections, handshakes) == (1, 1)
    [delivery] = deliveries
    assert delivery.rcpt_tos == ["ada@example.com"]
    assert "Subject: Welcome aboard" in delivery.content
    assert "Hello ada," in delivery.content
    assert (delivery.over_tls, delivery.authenticated_as) == (True, RELAY_USER)
    assert worker.terminate() == 0
    # The log holds the send (so it is the log to search), never the password.
    assert f"Welcome email sent for user {user_id}" in worker.log()
    assert relay_password not in worker.log()


def test_it_refuses_a_relay_whose_certificate_it_does_not_trust(
    client: Client,
    start_worker: Callable[..., WorkerProcess],  # noqa: F811 - fixture
    tmp_path: Path,
    relay_password: str,
) -> None:
    # Given a relay at the right address whose certificate comes from another CA
    trusted = CertificateAuthority.create(tmp_path / "trusted", name="Trusted CA")
    impostor = CertificateAuthority.create(tmp_path / "impostor", name="Impostor CA")
    with SMTPRelay(impostor.issue(), username=RELAY_USER, password=relay_password) as relay:
        worker = start_worker(relay_env(relay, trusted_ca=trusted.cert, password=relay_password))
        worker.wait_for_log(READY)

        # When someone signs up
        user_id = sign_up(client, "eve")

        # Then every attempt stops at the handshake: retried, then failed in the ledger
        wait_until(job_in(user_id, states.TERMINAL_STATES), timeout=20, every=0.05)
        connections, handshakes, logins, deliveries = relay.snapshot()

    job = welcome_job(user_id)
    assert job is not None
    failures = list(job.failures.values_list("error_type", "error_message", "traceback"))
    assert job.state == states.FAILED
    assert job.attempts == job.max_attempts > 1
    assert [error_type for error_type, _, _ in failures] == (
        ["SSLCertVerificationError"] * job.max_attempts
    )
    assert "certificate verify failed" in failures[0][1]
    # The worker reached the relay each time, and never finished a handshake,
    # logged in (the password never left) or sent a message.
    assert connections == job.max_attempts
    assert (handshakes, logins, deliveries) == (0, [], [])
    assert worker.terminate() == 0
    # The log holds each failure with its traceback, never the password.
    assert worker.log().count("ssl.SSLCertVerificationError") == job.max_attempts
    assert relay_password not in worker.log()
    assert not any(relay_password in text for _, message, tb in failures for text in (message, tb))
