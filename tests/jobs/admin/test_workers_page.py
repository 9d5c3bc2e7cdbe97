"""The admin's workers page: live and gone worker processes, their heartbeats and jobs."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import dramatiq
import pytest
import redis
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from jobs.broker import redis_broker, registry
from jobs.models import Job
from tests.conftest import wait_until
from tests.e2e.conftest import start_worker, worker_env  # noqa: F401 - fixtures
from tests.examples.tasks import long_job
from tests.jobs.admin.test_admin import staff  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db(transaction=True)
PAGE = "/admin/jobs/job/workers/"
QUEUE = "workers-page-test"
READY = "Worker process is ready for action."
HOST = socket.gethostname()
gate = threading.Event()


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def waits_at_the_gate(note: str) -> None:
    gate.wait(30)


@pytest.fixture
def worker(broker: dramatiq.Broker) -> Iterator[dramatiq.Worker]:
    """An in-process worker on this test's queue only, with 3 threads."""
    gate.clear()
    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_timeout=50, worker_threads=3)
    worker.start()
    yield worker
    gate.set()
    worker.stop(timeout=10_000)


def table(html: str, table_id: str) -> str:
    start = html.index(f'<table id="{table_id}">')
    return html[start : html.index("</table>", start)]


def worker_row(html: str, table_id: str, pid: int) -> str | None:
    """The row of process ``pid`` in ``table_id`` (live-workers or gone-workers), or None."""
    found = re.search(
        rf'<tr class="worker[^"]*" data-host="[^"]*" data-pid="{pid}"[^>]*>(.*?)</tr>',
        table(html, table_id),
        re.S,
    )
    return found.group(0) if found else None


def shown_at(ms: int) -> str:
    """How the page writes a moment: in the current time zone, to the second."""
    moment = timezone.localtime(datetime.fromtimestamp(ms / 1000, tz=UTC))
    return (
        f'<span class="nowrap">{moment:%Y-%m-%d}</span> '
        f'<span class="nowrap">{moment:%H:%M:%S}</span>'
    )


def page(client: Client) -> str:
    response = client.get(PAGE)
    assert response.status_code == 200
    return response.content.decode()


def running_job(actor_name: str, *, host: str = HOST, pid: int = 1) -> Job:
    now = timezone.now()
    return Job.objects.create(
        message_id=str(uuid.uuid4()),
        actor_name=actor_name,
        queue_name=QUEUE,
        state=Job.State.RUNNING,
        enqueued_at=now,
        started_at=now,
        worker_host=host,
        worker_pid=pid,
    )


def test_it_warns_that_no_workers_are_connected_until_one_beats(
    staff: Client,  # noqa: F811
    broker: dramatiq.Broker,
) -> None:
    # Given no worker process
    html = page(staff)
    # Then the warning is the page's first statement
    assert 'id="no-workers"' in html
    assert "No workers connected" in html

    # When one starts, the warning goes
    started = dramatiq.Worker(broker, queues={QUEUE}, worker_timeout=50, worker_threads=1)
    started.start()
    try:
        html = page(staff)
    finally:
        started.stop(timeout=10_000)
    assert "No workers connected" not in html
    assert worker_row(html, "live-workers", os.getpid()) is not None


def test_it_shows_a_live_worker_with_host_pid_queues_threads_and_a_fresh_heartbeat(
    staff: Client,  # noqa: F811
    worker: dramatiq.Worker,
) -> None:
    html = page(staff)

    row = worker_row(html, "live-workers", os.getpid())
    assert row is not None, table(html, "live-workers")
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    assert cells[0] == HOST
    assert cells[1] == str(os.getpid())
    assert cells[2] == QUEUE  # its whitelist, without the delay queue's name
    assert cells[3] == "3"
    age = re.search(r">([\d.]+) s ago<", cells[5])
    assert age is not None, cells[5]
    assert float(age.group(1)) < redis_broker().heartbeat_timeout / 1000
    assert "older than the timeout" not in row
    assert "1 live worker process," in html


def test_a_running_job_is_listed_under_its_worker_with_a_link_to_its_row(
    staff: Client,  # noqa: F811
    worker: dramatiq.Worker,
) -> None:
    # Given a job that runs until the gate opens
    message = waits_at_the_gate.send("hold")
    wait_until(lambda: Job.objects.filter(message_id=message.message_id, state="running").exists())
    job = Job.objects.get(message_id=message.message_id)

    # Then it is under this process's row, linked to its ledger row, with its age
    html = page(staff)
    row = worker_row(html, "live-workers", os.getpid())
    assert row is not None
    href = f"/admin/jobs/job/{job.pk}/change/"
    assert f'<a href="{href}" title="{job.message_id}">waits_at_the_gate</a>' in row
    assert re.search(r"for [\d.]+ s</span>", row)
    assert message.message_id in staff.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()

    # When it finishes, it is no longer listed
    gate.set()
    wait_until(lambda: Job.objects.get(pk=job.pk).state == "succeeded")
    assert f"/admin/jobs/job/{job.pk}/change/" not in page(staff)


def test_a_worker_stopped_cleanly_is_listed_as_stopped_with_its_last_beat(
    staff: Client,  # noqa: F811
    broker: dramatiq.Broker,
) -> None:
    started = dramatiq.Worker(broker, queues={QUEUE}, worker_timeout=50, worker_threads=2)
    started.start()
    started.stop(timeout=10_000)
    [record] = registry.recent()

    html = page(staff)
    assert worker_row(html, "live-workers", os.getpid()) is None
    row = worker_row(html, "gone-workers", os.getpid())
    assert row is not None
    assert 'data-status="stopped"' in row
    assert shown_at(record.last_beat_ms) in row
    assert 'id="no-workers"' in html


@pytest.mark.e2e
@pytest.mark.one_row("sqlite", "the registry and heartbeats live in Redis")
def test_a_killed_worker_is_flagged_stale_then_listed_as_lost_with_its_last_beat_and_job(
    staff: Client,  # noqa: F811
    start_worker: Any,  # noqa: F811
) -> None:
    timeout_s = redis_broker().heartbeat_timeout / 1000
    # Given a rundramatiq process running a long job
    victim = start_worker(threads=2, queues=("long",))
    victim.wait_for_log(READY)
    message = long_job.send("workers-page", 300)
    wait_until(
        lambda: Job.objects.filter(message_id=message.message_id, state="running").exists(),
        timeout=30,
    )
    job = Job.objects.get(message_id=message.message_id)
    assert job.worker_pid is not None
    link = f'href="/admin/jobs/job/{job.pk}/change/"'
    row = worker_row(page(staff), "live-workers", job.worker_pid)
    assert row is not None
    assert link in row
    assert '<td class="queues">long</td>' in row
    assert '<td class="num">2</td>' in row  # threads

    # When its whole process group freezes (heartbeat thread and pulse included)
    os.killpg(victim.process.pid, signal.SIGSTOP)
    try:
        # Then, still present, it is flagged once its beat is older than the timeout
        def flagged() -> bool:
            row = worker_row(page(staff), "live-workers", job.worker_pid or 0)
            return row is not None and "older than the timeout" in row

        wait_until(flagged, timeout=timeout_s + 10, every=0.5)
        html = page(staff)
        assert "1 without a heartbeat for longer than the timeout" in html
        # And when it is killed, it is listed as lost once its presence key expires
        [record] = registry.recent()
    finally:
        victim.kill()

    def lost() -> str | None:
        return worker_row(page(staff), "gone-workers", job.worker_pid or 0)

    wait_until(lost, timeout=40, every=0.5)
    row = lost()
    assert row is not None
    assert 'data-status="lost"' in row
    assert shown_at(record.last_beat_ms) in row
    assert link in row  # still marked running in the ledger: left behind
    assert worker_row(page(staff), "live-workers", job.worker_pid) is None


def silent_server() -> socket.socket:
    """A port that accepts connections and never answers: a hung Redis."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server


@pytest.mark.parametrize("outage", ["refused", "silent"])
def test_the_page_renders_and_says_so_when_redis_is_unreachable(
    staff: Client,  # noqa: F811
    outage: str,
) -> None:
    job = running_job("still_running", pid=4242)
    broker = redis_broker()
    # The broker client's own options (one attempt, no retry), a 1 s read timeout.
    options = {**broker.client.connection_pool.connection_kwargs, "socket_timeout": 1}
    server = silent_server()
    port = server.getsockname()[1]
    if outage == "refused":
        server.close()
    options.pop("path", None)
    pool = redis.ConnectionPool(**{**options, "host": "127.0.0.1", "port": port})
    # Restored here, not by monkeypatch: the autouse flush after the test needs it back.
    real_client, broker.client = broker.client, redis.Redis(connection_pool=pool)
    try:
        started = time.monotonic()
        html = page(staff)
        elapsed = time.monotonic() - started
    finally:
        broker.client = real_client
        server.close()

    error = "ConnectionError" if outage == "refused" else "TimeoutError"
    assert f"Redis is unreachable ({error})" in html
    assert f'href="/admin/jobs/job/{job.pk}/change/"' in table(html, "unplaced-jobs")
    assert "No workers connected" not in html  # unknown, not none
    assert elapsed < 2.5  # one call, bounded by the client's timeout; none after it


def test_it_escapes_what_workers_and_jobs_report(staff: Client) -> None:  # noqa: F811
    hostile = "<script>alert(1)</script>"
    pipe = redis_broker().client.pipeline(transaction=False)
    registry.beat_for(pipe, hostile, 77, "b1d", int(time.time() * 1000))
    pipe.execute()
    job = running_job('<img src=x onerror="alert(2)">', host=hostile, pid=77)

    html = page(staff)

    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img src=x" not in html
    row = worker_row(html, "gone-workers", 77)
    assert row is not None
    assert 'data-status="lost"' in row  # beat, never stopped, no presence key
    assert f'href="/admin/jobs/job/{job.pk}/change/"' in row


def test_records_older_than_an_hour_are_pruned_on_the_next_write(staff: Client) -> None:  # noqa: F811
    now_ms = int(time.time() * 1000)
    client = redis_broker().client
    pipe = client.pipeline(transaction=False)
    registry.beat_for(pipe, "old-host", 1, "b-old", now_ms - 3601 * 1000)
    pipe.execute()
    assert client.zcard(registry.INDEX) == 1
    pipe = client.pipeline(transaction=False)
    registry.beat_for(pipe, "new-host", 2, "b-new", now_ms)
    pipe.execute()
    assert client.zrange(registry.INDEX, 0, -1) == [b"new-host:2:b-new"]  # pruned

    html = page(staff)
    assert "new-host" in html
    assert "old-host" not in html


def test_only_staff_who_may_view_jobs_see_the_page_and_its_index_row(
    client: Client,
) -> None:
    user = User.objects.create_user("op", "op@example.com", "pw", is_staff=True)
    client.login(username="op", password="pw")
    # Without jobs.view_job: no page, no row in the index
    assert client.get(PAGE).status_code == 403
    assert PAGE not in client.get("/admin/").content.decode()

    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    assert client.get(PAGE).status_code == 200
    index = client.get("/admin/").content.decode()
    jobs_block = index[index.index('class="app-jobs module') :]
    jobs_block = jobs_block[: jobs_block.index("</table>")]
    assert f'<a href="{PAGE}">Workers</a>' in jobs_block
    # ... beside the job admin's other pages, which were reachable only from the list
    assert '<a href="/admin/jobs/job/dashboard/">Dashboard</a>' in jobs_block
    assert '<a href="/admin/jobs/job/schedules/">Schedules</a>' in jobs_block
    assert index.count(f'href="{PAGE}"') == 2  # that row's name and its "View" link, nowhere else
    for linked_from in ("/admin/jobs/job/", "/admin/jobs/job/dashboard/", "/admin/jobs/"):
        assert f'href="{PAGE}"' in client.get(linked_from).content.decode(), linked_from

    # Not staff: the admin's login page
    user.is_staff = False
    user.save()
    response = client.get(PAGE)
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
