"""Concurrency limits changed at run time from the admin: per key template and
per key pattern, followed by running workers, audited, refused when invalid."""

from __future__ import annotations

import time

import dramatiq
import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from jobs.broker import redis_broker
from jobs.concurrency import limits, slots
from jobs.models import AuditEntry
from tests.conftest import join, wait_until
from tests.jobs.concurrency.actors import QUEUE, most_at_once, pack, runs, start_worker

pytestmark = pytest.mark.django_db(transaction=True)
PAGE = "/admin/jobs/job/limits/"
CHANGE = "/admin/jobs/job/limits/change/"


@pytest.fixture
def operator(client: Client) -> Client:
    user = User.objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="view_job"), Permission.objects.get(codename="pause_queue")
    )
    client.login(username="ops", password="pw")
    return client


def test_an_operator_sets_and_resets_a_templates_limit_and_both_are_audited(
    operator: Client,
) -> None:
    page = operator.get(PAGE).content.decode()
    assert "<code>order:{order_id}</code>" in page
    assert operator.post(CHANGE, {"template": "order:{order_id}", "limit": "3"}).status_code == 302
    assert limits.read() == {"template:order:{order_id}": 3}
    assert "<strong>3</strong>" in operator.get(PAGE).content.decode()
    operator.post(CHANGE, {"template": "order:{order_id}", "limit": ""})
    assert limits.read() == {}
    trail = list(AuditEntry.objects.order_by("id").values_list("action", "who", "target", "note"))
    assert trail == [
        ("limit_set", "ops", "order:{order_id}", "override none -> 3"),
        ("limit_reset", "ops", "order:{order_id}", "override 3 -> none (declared)"),
    ]


@pytest.mark.parametrize(
    ("form", "says"),
    [
        ({"template": "order:{order_id}", "limit": "many"}, "A limit is a whole number"),
        ({"template": "order:{order_id}", "limit": "0"}, "between 1 and 100,000"),
        ({"pattern": "  ", "limit": "2"}, "A key pattern is 1 to 200 characters"),
    ],
)
def test_a_bad_limit_is_a_form_error_and_changes_nothing(
    operator: Client, form: dict[str, str], says: str
) -> None:
    answer = operator.post(CHANGE, form)
    assert answer.status_code == 200
    assert says in answer.content.decode()
    assert limits.read() == {}
    assert not AuditEntry.objects.exists()


def test_without_the_permission_the_page_is_read_only(client: Client) -> None:
    user = User.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.login(username="viewer", password="pw")
    assert 'name="limit"' not in client.get(PAGE).content.decode()
    answer = client.post(CHANGE, {"template": "order:{order_id}", "limit": "5"})
    assert answer.status_code == 403
    assert limits.read() == {}


def test_a_template_no_actor_declares_is_not_found(operator: Client) -> None:
    assert operator.post(CHANGE, {"template": "nope:{x}", "limit": "5"}).status_code == 404
    assert limits.read() == {}


def test_running_workers_follow_a_raised_limit_and_a_patterns_wins(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker]
) -> None:
    limits.change("template:order:{order_id}", 2)
    limits.change("pattern:order:9*", 3)
    for _ in range(6):
        pack.send(1, 0.1)
        pack.send(90, 0.1)
    start_worker(workers, broker, threads=8)
    join(QUEUE, timeout_ms=30_000)
    wait_until(lambda: len(runs) == 12)
    assert most_at_once("order:1") == 2  # the template's override, not the declared 1
    assert most_at_once("order:90") == 3  # the pattern's, over the template's


def test_raising_a_limit_starts_the_parked_jobs_at_once(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker]
) -> None:
    long = pack.send(1, 3.0)
    start_worker(workers, broker, threads=4)
    namespace, client = redis_broker().namespace, redis_broker().client
    wait_until(lambda: slots.holders(client, namespace, "order:1").get(long.message_id))
    waiting = [pack.send(1, 0.0) for _ in range(2)]
    wait_until(lambda: len(slots.parked(client, namespace, "order:1")) == 2)
    raised = time.monotonic()
    limits.change("template:order:{order_id}", 3)
    wait_until(lambda: len(runs) == 2, timeout=2.5)  # before the long job ends
    print(f"raised limit: parked jobs ran {time.monotonic() - raised:.3f} s later")
    assert not [run for run in runs if run[2] - run[1] > 1]
    assert len(waiting) == 2


QUEUE_R = "limits-review"
_made = [0]


def _job(key: str, limit: int) -> tuple[int, slots.Wanted]:
    """One delivery of a pack() job of ``key`` asking a live worker's slot."""
    namespace, client = redis_broker().namespace, redis_broker().client
    _made[0] += 1
    redis_id, message_id = f"r{_made[0]}", f"m{_made[0]}"
    client.hset(f"{namespace}:{QUEUE_R}.msgs", redis_id, pack.message(1, 0.0).encode())
    client.sadd(f"{namespace}:__acks__.live.{QUEUE_R}", redis_id)
    client.zadd(f"{namespace}:__heartbeats__", {"live": int(time.time() * 1000)})
    wanted = slots.Wanted(key, limit, message_id, redis_id, "pack", "order:{order_id}")
    [(outcome, *_)] = slots.acquire(
        client, namespace, [wanted], broker_id="live", queue_name=QUEUE_R, timeout_ms=60_000
    )
    return outcome, wanted


def _fill(key: str, limit: int, running: int, parked: int) -> list[slots.Wanted]:
    held = []
    for _ in range(running):
        outcome, wanted = _job(key, limit)
        assert outcome == slots.TAKEN
        held.append(wanted)
    for _ in range(parked):
        assert _job(key, limit)[0] == slots.PARKED_NOW
    return held


def _running(key: str) -> int:
    return len(slots.holders(redis_broker().client, redis_broker().namespace, key))


def test_a_changed_limit_reaches_only_the_keys_it_governs() -> None:
    # The review's case: a longer pattern keeps order:90 at 1 when the template
    # is raised to 3; raising the template must not hand order:90 three slots.
    limits.change("pattern:order:9*", 1)
    _fill("order:90", 1, running=1, parked=3)
    _fill("order:1", 1, running=1, parked=3)
    limits.change("template:order:{order_id}", 3)
    assert _running("order:90") == 1
    assert _running("order:1") == 3  # the template's own keys do get the room


@pytest.mark.parametrize("re_handed", [True, False], ids=["re-handed", "redis-failed-after"])
def test_a_removed_override_stops_handing_out_its_room(re_handed: bool) -> None:
    # Raised to 3, three run and five wait; back to the declared 1: as each of
    # the three ends, none of the waiting starts until one runs alone. Also when
    # the parked keys were not re-handed after the change (Redis failed right
    # after it): each release then carries the current limit itself.
    limits.change("template:order:{order_id}", 3)
    held = _fill("order:1", 3, running=3, parked=5)
    if re_handed:
        limits.change("template:order:{order_id}", None)
    else:
        limits.set_override("template:order:{order_id}", None)
    namespace, client = redis_broker().namespace, redis_broker().client
    seen = []
    for wanted in held:
        done = slots.Held(wanted.key, wanted.message_id, 1, wanted.redis_message_id)
        slots.release(client, namespace, [done], broker_id="live")
        slots.sweep(client, namespace, timeout_ms=60_000)
        seen.append(_running("order:1"))
    assert seen == [2, 1, 1]


@pytest.mark.parametrize("typed", ["2_0", "\u0663", "+3", "3.0"])
def test_only_ascii_digits_make_a_limit(operator: Client, typed: str) -> None:
    answer = operator.post(CHANGE, {"template": "order:{order_id}", "limit": typed})
    assert "A limit is a whole number" in answer.content.decode()
    assert limits.read() == {}
