"""A publish whose reply was lost is not sent again (single Redis, the default).

A web request waits for Redis for a short read timeout only (jobs.conf.timeouts),
so a slow or stalled Redis can take a message and time out before the answer
comes back. The outbox then cannot tell a lost reply from a lost message; its
relay must not publish a second copy of one that arrived.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from django.db import transaction

from jobs.broker import redis_broker
from jobs.conf.timeouts import REQUEST
from jobs.consistency import outbox, reachability
from jobs.consistency.outbox import publish, send_on_commit
from jobs.models import OutboxMessage
from tests.conftest import queued_messages
from tests.examples.tasks import demo_pipeline
from tests.proxy import ReplyDroppingProxy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def proxy(redis_server: str) -> Iterator[ReplyDroppingProxy]:
    parts = urlsplit(redis_server)
    proxy = ReplyDroppingProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    yield proxy
    proxy.close()


@pytest.fixture
def proxied_broker(
    proxy: ReplyDroppingProxy, monkeypatch: pytest.MonkeyPatch
) -> Iterator[redis.Redis]:
    """The broker's client, through the proxy, with a web request's timeouts (the
    test process may have booted in-process workers, which raise them)."""
    broker = redis_broker()
    real_client, real_packed = broker.client, broker._packed
    db = broker.client.connection_pool.connection_kwargs.get("db", 0)
    client = redis.Redis.from_url(
        proxy.url(db), socket_timeout=REQUEST.read, socket_connect_timeout=REQUEST.connect
    )
    monkeypatch.setattr(broker, "client", client)
    monkeypatch.setattr(broker, "_packed", None)  # the fast path's client, made again
    # Loaded, so that the warm-ups below go the fast way and leave a connection
    # open (a NOSCRIPT reply closes it, and a new one's handshake would be lost)
    client.script_load(broker._enqueue_script.script)
    reachability.reset()
    yield client
    reachability.reset()
    client.close()
    # Back to the real client now, not when monkeypatch undoes (pytest-django's
    # autouse fixtures set monkeypatch up first, so it undoes last): the
    # suite's Redis flush after each test would otherwise go through the proxy,
    # closed by then, and fail with "connection refused" whenever its listening
    # socket was already gone.
    monkeypatch.setattr(broker, "client", real_client)
    monkeypatch.setattr(broker, "_packed", real_packed)


# A restarted Redis (or a promoted replica) has an empty script cache: an
# EVALSHA there is refused, and must not leave a marker without its message.
@pytest.mark.parametrize("script_cache", ["warm", "lost"])
def test_a_publish_whose_reply_was_lost_is_sent_once(
    settings: Any, proxy: ReplyDroppingProxy, proxied_broker: redis.Redis, script_cache: str
) -> None:
    assert settings.JOBS_OUTBOX_WAIT_REPLICAS == 0  # the shipped single-Redis default

    # Given a request whose publish reaches Redis but whose reply is lost (after
    # one that went through: connected, scripts built, only the reply goes missing)
    with transaction.atomic():
        warm = send_on_commit(demo_pipeline, "warm-up")
    if script_cache == "lost":
        proxied_broker.script_flush()
    proxy.drop_replies = True
    with transaction.atomic():
        row = send_on_commit(demo_pipeline, "lost reply")
    proxy.drop_replies = False
    row.refresh_from_db()
    assert row.sent_at is None  # it timed out...
    assert "Timeout" in row.last_error
    # ... yet Redis took the message, unless it refused the script (NOSCRIPT:
    # nothing of it ran, the marker included)
    assert len(queued_messages("default")) == (2 if script_cache == "warm" else 1)

    # When Redis answers again and the relay comes back to the row
    reachability.reset()
    OutboxMessage.objects.filter(pk=row.pk).update(claimed_until=None)
    settled = publish([row.pk])

    # Then the row is settled without a second copy; the marker expires on its own
    assert settled == 1
    assert sorted(m.message_id for m in queued_messages("default")) == sorted(
        [warm.message_id, row.message_id]
    )
    assert 0 < proxied_broker.pttl(outbox._marker(row.message_id)) <= outbox.SINGLE_MARKER_KEEP_MS


def test_a_publish_arriving_after_the_relay_sent_it_again_does_nothing(
    proxy: ReplyDroppingProxy, proxied_broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a request whose publish is held up on the way (after one that went
    # through: connected, scripts built): it times out and the row stays pending
    with transaction.atomic():
        send_on_commit(demo_pipeline, "warm-up")
    proxy.request_delay = 2.0
    with transaction.atomic():
        row = send_on_commit(demo_pipeline, "in flight")
    row.refresh_from_db()
    assert row.sent_at is None

    # When a worker's relay, on its own healthy connection, sends it before the
    # held-up bytes arrive, and then they arrive
    broker = redis_broker()
    monkeypatch.setattr(
        broker,
        "client",
        redis.Redis.from_url(proxy.url().replace(f":{proxy.port}/", f":{proxy.target[1]}/")),
    )
    monkeypatch.setattr(broker, "_packed", None)
    reachability.reset()
    OutboxMessage.objects.filter(pk=row.pk).update(claimed_until=None)
    assert publish([row.pk]) == 1
    time.sleep(2.5)

    # Then Redis holds one copy (the script enqueues once per marker; before,
    # two: the relay had found no marker yet)
    copies = [m for m in queued_messages("default") if m.message_id == row.message_id]
    assert len(copies) == 1
