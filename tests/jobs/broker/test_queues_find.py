"""queues.find: a waiting message is found whatever its Redis id, even while it
moves between its queue and its delay queue as the watchdog reads.

A message moves by being written to one hash before it is deleted from the
other, so it is always somewhere; the danger is reading the place it is about
to arrive in, then the place it just left. The reader below moves the message
(with real broker writes) right after each hash is read, into the hash just
read: the worst timing there is.

Run: bin/test tests/jobs/broker/test_queues_find.py   (also with --postgres)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import dramatiq
import pytest

from jobs.broker import queues, redis_broker

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "find-moving"
HOUR_MS = 3_600_000


@dramatiq.actor(queue_name=QUEUE)
def parked(n: int) -> None:
    raise AssertionError("no worker runs in these tests")


def _hash(suffix: str) -> str:
    return f"{redis_broker().namespace}:{QUEUE}.{suffix}"


def _where(message_id: str) -> tuple[str, str] | None:
    client = redis_broker().client
    for suffix in ("msgs", "DQ.msgs"):
        payloads = cast(dict[bytes, bytes], client.hgetall(_hash(suffix)))
        for redis_id, raw in payloads.items():
            if dramatiq.Message.decode(raw).message_id == message_id:
                return suffix, redis_id.decode()
    return None


def _move(message: dramatiq.Message[Any], into: str) -> None:
    """What a worker does: write the copy where it goes, then drop the old one."""
    suffix, old_id = _where(message.message_id) or ("", "")
    broker = redis_broker()
    copy = message.copy(queue_name=QUEUE)
    broker.enqueue(copy, delay=HOUR_MS if into == "DQ.msgs" else None)
    old_queue = f"{broker.namespace}:{QUEUE}" + (".DQ" if suffix == "DQ.msgs" else "")
    pipe = broker.client.pipeline()
    pipe.hdel(_hash(suffix), old_id)
    pipe.lrem(old_queue, 0, old_id)
    pipe.execute()


class MovingReader:
    """Wraps the client's hscan_iter: after each hash is read, the message moves
    into it (if it is not there already), ``moves`` times at most."""

    def __init__(self, message: dramatiq.Message[Any], moves: int) -> None:
        self.message = message
        self.moves_left = moves
        self.moved = 0
        self.places = [_where(message.message_id)]  # every (hash, redis id) it had
        self._scan = redis_broker().client.hscan_iter

    def __call__(self, name: str, **options: Any) -> Iterator[tuple[bytes, bytes]]:
        yield from self._scan(name, **options)
        into = name.removeprefix(f"{redis_broker().namespace}:{QUEUE}.")
        where = _where(self.message.message_id)
        if self.moves_left and where is not None and where[0] != into:
            _move(self.message, into)
            self.moves_left -= 1
            self.moved += 1
            self.places.append(_where(self.message.message_id))


@pytest.fixture
def empty_queue() -> Iterator[None]:
    redis_broker().flush(QUEUE)
    yield
    redis_broker().flush(QUEUE)


@pytest.mark.parametrize("starts_in", ["msgs", "DQ.msgs"])
@pytest.mark.parametrize("moves", [1, 2])
def test_it_finds_a_message_that_moves_while_it_reads(
    empty_queue: None, monkeypatch: pytest.MonkeyPatch, starts_in: str, moves: int
) -> None:
    # Given a message waiting (or delayed) under a Redis id the ledger does not know
    message = parked.send_with_options(args=(1,), delay=HOUR_MS if starts_in == "DQ.msgs" else None)
    reader = MovingReader(message, moves)
    monkeypatch.setattr(redis_broker().client, "hscan_iter", reader)

    # When it is looked for while it moves at the worst moments
    found = queues.find(QUEUE, {message.message_id})

    # Then it is found, under one of the Redis ids it had
    print(f"\nstarted in {starts_in}, moved {reader.moved} time(s), found {found}")
    assert set(found) == {message.message_id}
    place, redis_id = found[message.message_id]
    suffix = "DQ.msgs" if place == "delayed" else "msgs"
    assert (suffix, redis_id) in reader.places


def test_a_message_that_is_nowhere_is_not_found(empty_queue: None) -> None:
    parked.send(2)
    assert queues.find(QUEUE, {"not-a-message-id"}) == {}
