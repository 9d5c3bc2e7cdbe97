"""A publish whose reply was lost is not sent again (single Redis, the default).

A web request waits for Redis for a short read timeout only (jobs.conf.timeouts),
so a slow or stalled Redis can take a message and time out before the answer
comes back. The outbox then cannot tell a lost reply from a lost message; its
relay must not publish a second copy of one that arrived.
"""

from __future__ import annotations

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
    db = broker.client.connection_pool.connection_kwargs.get("db", 0)
    client = redis.Redis.from_url(
        proxy.url(db), socket_timeout=REQUEST.read, socket_connect_timeout=REQUEST.connect
    )
    monkeypatch.setattr(broker, "client", client)
    monkeypatch.setattr(broker, "_packed", None)  # the fast path's client, made again
    reachability.reset()
    yield client
    reachability.reset()
    client.close()


# A restarted Redis (or a promoted replica) has an empty script cache: an
# EVALSHA there is refused while the marker written after it is not.
@pytest.mark.parametrize("script_cache", ["warm", "lost"])
def test_a_publish_whose_reply_was_lost_is_not_sent_again_nor_lost(
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
    assert len(queued_messages("default")) == 2  # ... yet Redis took the message

    # When Redis answers again and the relay comes back to the row
    reachability.reset()
    OutboxMessage.objects.filter(pk=row.pk).update(claimed_until=None)
    settled = publish([row.pk])

    # Then the row is settled without a second copy, and no marker is left
    assert settled == 1
    assert sorted(m.message_id for m in queued_messages("default")) == sorted(
        [warm.message_id, row.message_id]
    )
    assert proxied_broker.keys(f"{outbox.MARKER_PREFIX}*") == []
