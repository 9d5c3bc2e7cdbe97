"""Argument search: ``user_id=7`` finds the jobs called with it, by name.

Declared paths (``search_by``, or ``refers_to`` for an id) are indexed rows
found at any age; other arguments are read from the newest rows' args/kwargs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from jobs.cli.selection import search
from jobs.ledger import argument_search
from jobs.ledger import writer as ledger
from jobs.ledger.references import declaration_errors
from jobs.models import Job, JobReference
from tests.conftest import join

Term = argument_search.ArgumentTerm
QUEUE = "argument-search-test"
dramatiq.get_broker().declare_queue(QUEUE)  # before any worker: see test_ledger.py
FAR = argument_search.RECENT_ROWS + 10  # an id that makes row 1 "old"


@dramatiq.actor(queue_name=QUEUE, search_by=("order.number", "tags", "password"))
def search_ship(
    customer: str, order: dict[str, Any], *, tags: Any = (), password: str = ""
) -> None:
    pass


@dramatiq.actor(queue_name=QUEUE)
def search_plain(user_id: Any, note: str = "", *, options: Any = None) -> None:
    pass


@dramatiq.actor(queue_name=QUEUE, refers_to={"user_id": "auth.User"})
def greet_by_id(user_id: int) -> None:
    pass


def row(
    actor: str, args: list[Any], kwargs: dict[str, Any] | None = None, pk: int | None = None
) -> Job:
    return Job.objects.create(
        id=pk,
        message_id=str(uuid.uuid4()),
        actor_name=actor,
        queue_name=QUEUE,
        enqueued_at=timezone.now(),
        args=args,
        kwargs=kwargs or {},
    )


def found(term: str) -> list[int]:
    parsed = argument_search.parse(term)
    assert parsed is not None, term
    return sorted(argument_search.matching(Job.objects.all(), parsed).values_list("id", flat=True))


@pytest.fixture
def worker(broker: dramatiq.Broker) -> Iterator[None]:
    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_timeout=50, worker_threads=2)
    worker.start()
    yield
    try:
        join(QUEUE)
    finally:
        worker.stop()
    ledger.flush()


def test_it_reads_only_name_equals_value() -> None:
    assert argument_search.parse("user_id=7") == Term(("user_id",), (7, "7"))
    assert argument_search.parse('user_id="7"') == Term(("user_id",), ("7",))
    assert argument_search.parse("a.b=null") == Term(("a", "b"), (None, "null"))
    assert argument_search.parse("note=a=b") == Term(("note",), ("a=b",))
    for other in ("welcome email", "auth.user:7", "=7", "7=7", "user id=7"):
        assert argument_search.parse(other) is None, other


@pytest.mark.django_db(transaction=True)
def test_declared_paths_are_indexed_rows_found_at_any_age(broker: dramatiq.Broker) -> None:
    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_timeout=50, worker_threads=2)
    worker.start()
    try:
        sent = search_ship.send(
            "ada", {"number": "A-12"}, tags=["urgent", "eu"], password="hunter2-long-secret"
        )
        other = search_ship.send("bob", {"number": "A-13"})
        join(QUEUE)
    finally:
        worker.stop()
    ledger.flush()
    job = Job.objects.get(message_id=sent.message_id)
    assert set(JobReference.objects.filter(job=job).values_list("subject", flat=True)) == {
        "order.number=A-12",
        "tags=urgent",
        "tags=eu",  # a list: one row per element
    }  # and the secret-looking value none
    # Made old: a declared path is found however many jobs came after it
    row("search_plain", [1], pk=job.pk + FAR)

    assert found("order.number=A-12") == [job.pk]
    assert found("tags=eu") == [job.pk]
    assert found("order.number=A-14") == []
    assert found("password=hunter2-long-secret") == []
    assert Job.objects.get(message_id=other.message_id).pk in found("order.number=A-13")


@pytest.mark.django_db
def test_other_arguments_are_read_by_position_or_keyword_among_recent_rows() -> None:
    by_position = row("search_plain", [7, "hello"])
    by_keyword = row("search_plain", [], {"user_id": "7"})
    nested = row("search_plain", [{"org": {"id": 3}}], {"options": {"exact": None}})
    row("search_plain", [70])
    row("search_ship", ["7", {"number": "7"}])  # a "7" in another parameter: not user_id
    row("daily_report", [])  # an actor without that argument is never read

    assert found("user_id=7") == [by_position.pk, by_keyword.pk]
    assert found('user_id="7"') == [by_keyword.pk]  # the text only
    assert found("note=hello") == [by_position.pk]
    assert found("user_id.org.id=3") == [nested.pk]
    assert found("options.exact=null") == [nested.pk]  # a key named like a lookup
    assert found("user_id=8") == []
    assert found("nobody_takes_this=1") == []

    row("search_plain", [1], pk=by_position.pk + FAR)
    assert found("user_id=7") == []  # beyond the newest RECENT_ROWS: not read


@pytest.mark.django_db
def test_an_id_the_actor_refers_to_is_found_through_its_reference_row() -> None:
    job = row("greet_by_id", [7], pk=1)
    JobReference.objects.create(job=job, subject="auth.user:7")  # as the ledger writes it
    row("greet_by_id", [8], pk=FAR)

    assert found("user_id=7") == [job.pk]  # old, yet found: through its reference row


@pytest.mark.django_db
def test_the_admin_and_the_cli_search_by_argument() -> None:
    wanted, _ = row("search_plain", [7]), row("search_plain", [8])
    admin = get_user_model().objects.create_superuser("boss", "b@example.com", "x")
    client = Client()
    client.force_login(admin)

    page = client.get("/admin/jobs/job/", {"q": "user_id=7"})

    assert page.status_code == 200
    assert [job.id for job in page.context["cl"].result_list] == [wanted.id]
    assert list(search(Job.objects.all(), "user_id=7").values_list("id", flat=True)) == [wanted.id]


def test_a_declared_path_must_start_with_an_argument(broker: dramatiq.Broker) -> None:
    @dramatiq.actor(queue_name=QUEUE, search_by=("order_no",))
    def misspelt(order_number: str) -> None:
        pass

    try:
        assert "misspelt: search_by names 'order_no', not an argument" in declaration_errors()
    finally:
        del broker.actors["misspelt"]
