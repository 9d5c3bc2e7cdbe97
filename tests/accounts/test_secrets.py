"""A password never lands in messages, the ledger, the outbox, Redis or the logs."""

from __future__ import annotations

import json
import logging
from typing import Any

import dramatiq
import pytest
from django.test import Client
from django_redis import get_redis_connection

from jobs.broker import redis_broker
from jobs.ledger import writer as ledger
from jobs.models import Job, OutboxMessage
from tests.conftest import join

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "Sekrit-Passw0rd-1729"


def redis_dump(client: Any) -> str:
    parts = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        if kind == "string":
            parts.append(repr(client.get(key)))
        elif kind == "hash":
            parts.append(repr(client.hgetall(key)))
        elif kind == "list":
            parts.append(repr(client.lrange(key, 0, -1)))
        elif kind == "set":
            parts.append(repr(client.smembers(key)))
        elif kind == "zset":
            parts.append(repr(client.zrange(key, 0, -1)))
    return "\n".join(parts)


def test_a_signup_leaves_no_password_anywhere(
    client: Client, worker: dramatiq.Worker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    body = {"username": "carol", "email": "carol@example.com", "password": PASSWORD}
    response = client.post("/api/signup/", body, content_type="application/json")
    assert response.status_code == 201
    # A failing signup (password echoed back nowhere either).
    client.post("/api/signup/", {**body, "email": "bad"}, content_type="application/json")
    join("emails")
    ledger.flush()

    job = Job.objects.get(actor_name="send_welcome_email")
    stored = json.dumps([job.args, job.kwargs, job.options, job.error_message, job.traceback])
    outbox = json.dumps(list(OutboxMessage.objects.values_list("payload", flat=True)))
    broker_data = redis_dump(redis_broker().client)
    cache_data = redis_dump(get_redis_connection("default"))

    assert job.state == "succeeded"
    for place, text in [
        ("ledger", stored),
        ("outbox", outbox),
        ("broker redis", broker_data),
        ("cache redis", cache_data),
        ("logs", caplog.text),
        ("api responses", response.content.decode()),
    ]:
        assert PASSWORD not in text, f"password found in {place}"
    assert broker_data  # the scan did see the broker's keys
