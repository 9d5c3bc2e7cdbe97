"""The hostile-input corpus against the production set-up, on the suite's database (issue 30).

gunicorn with the shipped config (2 workers), DEBUG off, Redis with a password,
ADMINS set and error emails captured in files. Every request of
``hostile_requests.jsonl`` is replayed by several client threads over plain
sockets, anonymously or as a superuser who logged in through ``/admin/login/``.
The history is then checked as a whole: no answer of 500 or more, no missing
answer, no worker lost, no secret in any email, log line or response body, and
a bounded number of error emails.

Then two floods measure how many error emails 100 failing anonymous requests
send: copies of the first anonymous request of the corpus still answered 5xx (if
any), and, Redis killed, ``GET /healthz`` (a 503 each, which Django reports as a
server error). ``replay.jsonl`` and ``summary.json`` stay in the test's tmp_path.

Run it (``-rP`` prints the figures):

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/security
    bin/test --postgres -q -p no:cacheprovider tests/security
"""

from __future__ import annotations

import json
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.db import connection
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.exceptions import Resolver404

from jobs.observability.errorreports import PER_HOUR
from tests.security import make_corpus
from tests.security.corpus import CORPUS, HostileRequest, Identity, load, sizes
from tests.security.mailbox import messages, readable
from tests.security.production import WORKERS, ProductionSite
from tests.security.wire import Answer, send

CLIENT_THREADS = 8
FLOOD = 100
# Each error kind is mailed once per 10 minutes and at most PER_HOUR times an hour,
# per process (jobs.observability.errorreports): the bound a flood cannot pass.
MAX_ERROR_EMAILS = WORKERS * PER_HOUR


@dataclass
class Outcome:
    request: HostileRequest
    answer: Answer
    seconds: float


def address_for(request_id: int) -> str:
    """A loopback address of the request's own: each is judged on its input, not
    answered 429 because a thousand others came from 127.0.0.1 (the rate limits'
    own answers are in the corpus, sent from one address on purpose)."""
    return f"127.10.{request_id // 250}.{request_id % 250 + 1}"


@pytest.fixture
def site(
    tmp_path: Path, test_database_url: str, transactional_db: None
) -> Iterator[ProductionSite]:
    # transactional_db first: gunicorn (and its database connections) stops before
    # the test database is flushed.
    production = ProductionSite(tmp_path, test_database_url)
    try:
        yield production.start()
    finally:
        production.stop()


def create_superuser() -> tuple[Any, str]:
    """A superuser whose password production can check (the test settings hash with MD5)."""
    password = secrets.token_hex(12)
    hasher = PBKDF2PasswordHasher()
    user = get_user_model().objects.create(
        username=f"staff-{secrets.token_hex(4)}",
        email="staff@example.com",
        is_staff=True,
        is_superuser=True,
        password=hasher.encode(password, hasher.salt()),
    )
    return user, password


def request(method: str, path: str, **parts: Any) -> HostileRequest:
    return HostileRequest(
        id=0, category="setup", who="anonymous", method=method, path=path, why="", **parts
    )


def fetch(site: ProductionSite, req: HostileRequest, source: str = "127.0.0.1") -> Answer:
    data = req.encode(Identity(), f"127.0.0.1:{site.port}")
    return send(site.port, data, method=req.method, source=source)


def log_in(site: ProductionSite, user: Any, password: str) -> Identity:
    """Log in through /admin/login/ as a browser would: the token, then the form."""
    token = fetch(site, request("GET", "/admin/login/")).cookies()["csrftoken"]
    form = [
        ("csrfmiddlewaretoken", token),
        ("username", user.username),
        ("password", password),
        ("next", "/admin/"),
    ]
    answer = fetch(
        site,
        request("POST", "/admin/login/", form=form, headers=[("Cookie", f"csrftoken={token}")]),
    )
    assert answer.status == 302, (answer.status, answer.body[:2000])
    cookies = answer.cookies()
    return Identity(cookies.get("csrftoken", token), cookies["sessionid"], str(user.pk))


def anonymous(site: ProductionSite) -> Identity:
    return Identity(
        csrftoken=fetch(site, request("GET", "/accounts/signup/")).cookies()["csrftoken"]
    )


def replay(
    site: ProductionSite, requests: list[HostileRequest], identities: dict[str, Identity]
) -> list[Outcome]:
    host = f"127.0.0.1:{site.port}"

    def one(req: HostileRequest) -> Outcome:
        data = req.encode(identities[req.who], host)
        started = time.monotonic()
        answer = send(site.port, data, method=req.method, source=req.source or address_for(req.id))
        return Outcome(req, answer, time.monotonic() - started)

    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        return list(pool.map(one, requests))


def protocol_answer(outcome: Outcome) -> bool:
    """What HTTP itself prescribes, which no application could answer otherwise.

    - 501 from gunicorn (Django never saw the request: no X-Request-ID) for a
      transfer coding it does not implement: RFC 9112, section 6.1.
    - No answer to bytes without a line end: the server still waits for a
      request line when the client closes.
    """
    req, answer = outcome.request, outcome.answer
    if answer.status == 501:
        codings = any(name.lower() == "transfer-encoding" for name, _ in req.headers)
        return codings and not answer.header("X-Request-ID")
    if answer.status is None and req.raw is not None:
        return "\n" not in req.raw
    return False


def log_records(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON records of a gunicorn stream, and the lines that are not one."""
    records, strays = [], []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif line.strip():
            strays.append(line)
    return records, strays


def traceback_of(outcome: Outcome, records: list[dict[str, Any]]) -> str:
    """The error logged for this request: by its X-Request-ID, else (an exception that
    escaped Django, which gunicorn answered itself) by gunicorn's line for its target."""
    request_id = outcome.answer.header("X-Request-ID")
    escaped = f"Error handling request {outcome.request.method} {outcome.request.path}"
    found = [
        r.get("exc_info") or r.get("message", "")
        for r in records
        if r.get("level") == "ERROR"
        and ((request_id and r.get("request_id") == request_id) or r.get("message") == escaped)
    ]
    return found[0][-3000:] if found else "(no error logged for this request)"


def failed(outcome: Outcome) -> bool:
    """Answered 500 or more, or not at all, where HTTP does not prescribe it."""
    status = outcome.answer.status
    return (status is None or status >= 500) and not protocol_answer(outcome)


def server_errors(outcomes: list[Outcome], err_records: list[dict[str, Any]]) -> list[str]:
    """Each answer of 500 or more, and each missing answer, with its request and traceback."""
    found = []
    for o in outcomes:
        if not failed(o):
            continue
        if o.answer.status is None:
            found.append(f"no answer ({o.answer.error}) for {o.request.describe()}")
            continue
        found.append(
            f"{o.answer.status} for {o.request.describe()}\n  response: {o.answer.body[:300]!r}\n"
            f"  traceback:\n{traceback_of(o, err_records)}"
        )
    return found


def leaks(secrets_by_name: dict[str, str], texts: dict[str, str]) -> list[str]:
    return [
        f"{name} in {where}"
        for where, text in texts.items()
        for name, value in secrets_by_name.items()
        if value and value in text
    ]


def email_summary(directory: Path) -> tuple[int, Counter[str]]:
    found = messages(directory)
    return len(found), Counter(str(message["Subject"])[:100] for message in found)


def flood(
    site: ProductionSite, req: HostileRequest, identity: Identity, first: int
) -> dict[str, Any]:
    """FLOOD copies of ``req``, each from its own address: the answers and the emails sent."""
    before, _ = email_summary(site.mail_dir)
    data = req.encode(identity, f"127.0.0.1:{site.port}")
    answers = [
        send(site.port, data, method=req.method, source=address_for(first + i))
        for i in range(FLOOD)
    ]
    after, _ = email_summary(site.mail_dir)
    return {
        "request": req.describe()[:160],
        "statuses": dict(Counter(str(a.status) for a in answers)),
        "error_emails": after - before,
    }


def write_replay_log(path: Path, outcomes: list[Outcome]) -> None:
    """One line a request (id, status, seconds), to look into a slow or failed run."""
    with path.open("w") as log:
        for o in outcomes:
            row = {"id": o.request.id, "status": o.answer.status, "seconds": round(o.seconds, 3)}
            log.write(json.dumps(row) + "\n")


@pytest.mark.e2e
@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
def test_the_hostile_corpus_gets_no_server_error_and_leaks_no_secret(
    site: ProductionSite, tmp_path: Path
) -> None:
    # Given the production-like site, a superuser logged in through the admin
    user, password = create_superuser()
    identities = {"staff": log_in(site, user, password), "anonymous": anonymous(site)}
    corpus = load()

    # When the whole corpus is replayed by several clients at once
    started = time.monotonic()
    outcomes = replay(site, corpus, identities)
    replay_seconds = time.monotonic() - started
    corpus_emails, corpus_subjects = email_summary(site.mail_dir)

    # ... then floods of anonymous requests that each fail: the first request of the
    # corpus that still does, if any, and (Redis gone) GET /healthz, a 503 each
    failing = next(
        (o.request for o in outcomes if o.request.who == "anonymous" and failed(o)), None
    )
    failing_flood = (
        flood(site, failing, identities["anonymous"], 5000)
        if failing is not None
        else "none: no anonymous request of the corpus is answered 5xx"
    )
    site.redis.kill()
    redis_down_flood = flood(site, request("GET", "/healthz"), Identity(), 6000)
    total_emails, subjects = email_summary(site.mail_dir)
    site.stop()

    # Then no server error, no missing answer, no worker lost
    out_records, out_strays = log_records(site.stdout_path)
    err_records, err_strays = log_records(site.stderr_path)
    problems = server_errors(outcomes, err_records)
    booted = sum("Booting worker" in r.get("message", "") for r in err_records)
    if booted != WORKERS:
        problems.append(f"{booted} workers booted for {WORKERS}: a worker died and was replaced")
    # ... no secret in an email, a log line or a response, and every log line one JSON
    # object (a forged line would not be)
    emails = {
        f"email {i}: {m['Subject']}": readable(m) for i, m in enumerate(messages(site.mail_dir), 1)
    }
    # Each email shows the settings (Redis's address among them), where a password
    # would be: one that did not would hide a leak from the search below.
    blind = [name for name, text in emails.items() if f"127.0.0.1:{site.redis.port}/" not in text]
    problems += [f"{name} shows no settings: the leak search cannot see into it" for name in blind]
    texts = {
        **emails,
        "gunicorn's stdout": site.stdout_path.read_text(errors="replace"),
        "gunicorn's stderr": site.stderr_path.read_text(errors="replace"),
        **{
            f"the response to {o.request.describe()}": o.answer.body.decode("utf-8", "replace")
            for o in outcomes
        },
    }
    secrets_by_name = {
        "the Redis password": site.redis.password,
        "the database password": str(connection.settings_dict.get("PASSWORD") or ""),
        "the secret key": site.secret_key,
        "METRICS_TOKEN": site.metrics_token,
        "the staff user's password": password,
        "the staff user's session id": identities["staff"].sessionid,
    }
    problems += leaks(secrets_by_name, texts)
    problems += [f"a log line that is not JSON: {line[:300]!r}" for line in out_strays + err_strays]
    # ... and error emails bounded, the flood included
    if total_emails > MAX_ERROR_EMAILS:
        problems.append(f"{total_emails} error emails, more than {MAX_ERROR_EMAILS}")

    write_replay_log(tmp_path / "replay.jsonl", outcomes)
    statuses = Counter(str(o.answer.status) for o in outcomes)
    summary = {
        "database": connection.vendor,
        "requests": len(outcomes),
        "by_category": dict(sizes(corpus)),
        "replay_seconds": round(replay_seconds, 1),
        "statuses": dict(sorted(statuses.items())),
        "protocol_answers": [
            f"{o.answer.status}: {o.request.describe()}" for o in outcomes if protocol_answer(o)
        ],
        "slowest": [
            f"{o.seconds:.2f} s: {o.request.describe()[:120]}"
            for o in sorted(outcomes, key=lambda o: o.seconds, reverse=True)[:5]
        ],
        "error_emails_from_corpus": corpus_emails,
        "error_email_subjects_from_corpus": dict(corpus_subjects),
        "flood_of_a_failing_corpus_request": failing_flood,
        "flood_of_healthz_with_redis_down": redis_down_flood,
        "error_emails_in_all": total_emails,
        "error_email_subjects": dict(subjects),
        "log_records": {"stdout": len(out_records), "stderr": len(err_records)},
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    assert not problems, f"{len(problems)} problem(s):\n" + "\n\n".join(problems)


# --- The corpus file itself ---------------------------------------------------------


def test_the_corpus_file_is_what_make_corpus_writes() -> None:
    assert CORPUS.read_text() == make_corpus.build().lines(), (
        "hostile_requests.jsonl is stale: run .venv/bin/python -m tests.security.make_corpus"
    )


def test_the_corpus_holds_a_thousand_requests_of_every_kind() -> None:
    counts = sizes(load())
    assert sum(counts.values()) >= 1000
    expected = {"json", "form", "admin-forms", "methods", "paths", "headers", "admin-query"}
    assert set(counts) == expected
    assert all(count >= 50 for count in counts.values()), counts


def _routes(resolver: URLResolver, prefix: str = "") -> Iterator[str]:
    for pattern in resolver.url_patterns:
        route = prefix + str(pattern.pattern).removeprefix("^")
        if isinstance(pattern, URLPattern):
            yield route
        else:
            yield from _routes(pattern, route)


def test_the_corpus_sends_requests_to_every_url_of_the_project() -> None:
    reached = set()
    for req in load():
        path = req.path.replace("{staff_id}", "1").split("?")[0].split("#")[0]
        try:
            reached.add(resolve(path).route)
        except Resolver404:
            continue
    missing = set(_routes(get_resolver())) - reached
    assert not missing, f"no request in the corpus reaches {sorted(missing)}"
