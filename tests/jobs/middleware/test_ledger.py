"""The Ledger middleware declares the actor options it reads."""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import pytest

from jobs.ledger import writer as ledger
from jobs.models import Job
from tests.conftest import IDLE_POLL_MS, join

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "ledger-options-test"
# Declared now, before any test's worker runs: a stopped dramatiq Worker leaves
# its middleware on the broker, which starts consumers (with no worker threads)
# for a queue declared later, and they would hold this test's message.
dramatiq.get_broker().declare_queue(QUEUE)


@pytest.fixture
def _forget_actors(broker: dramatiq.Broker) -> Iterator[None]:
    before = set(broker.actors)
    yield
    for name in set(broker.actors) - before:
        del broker.actors[name]


@pytest.mark.usefixtures("_forget_actors")
def test_an_actor_may_ask_for_its_return_value_to_be_kept(broker: dramatiq.Broker) -> None:
    # Given an actor declared through dramatiq's own decorator, which refuses
    # options no middleware declares
    @dramatiq.actor(queue_name=QUEUE, store_return_value=True)
    def answer(question: str) -> dict[str, str]:
        return {"question": question, "answer": "42"}

    # When it runs
    message = answer.send("everything")
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        join(QUEUE)
    finally:
        worker.stop()
    ledger.flush()

    # Then the ledger keeps what it returned
    job = Job.objects.get(message_id=message.message_id)
    assert job.state == "succeeded"
    assert job.return_value == {"question": "everything", "answer": "42"}


@pytest.mark.usefixtures("_forget_actors")
def test_an_actor_may_declare_what_its_arguments_refer_to_and_keep_its_result(
    broker: dramatiq.Broker,
) -> None:
    # Both options of the Ledger, together: neither declaration hides the other.
    @dramatiq.actor(queue_name=QUEUE, store_return_value=True, refers_to={"user_id": "auth.User"})
    def both(user_id: int) -> None:
        pass

    assert {"store_return_value", "refers_to"} <= broker.actor_options
