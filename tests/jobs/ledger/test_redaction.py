"""Secrets in free text (log lines, tracebacks) are masked; other text is left alone."""

from __future__ import annotations

import base64
import random
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

from jobs.ledger.redaction import mask_values, redact, redact_text, secret_values

# A denial-of-service bound, not a speed benchmark: linear redaction of 64 KiB
# takes milliseconds; the super-linear patterns this guards against took from
# seconds (dotted text, repeated "eyJ", random base64url) to minutes (hyphens).
DOS_BOUND_S = 1.0
SIZE = 64 * 1024


@contextmanager
def at_most(seconds: float) -> Iterator[None]:
    """Fail once ``seconds`` of CPU have been spent, rather than wait out a runaway
    regex. CPU time, not wall time: a loaded machine's pauses are not the
    regex's; and its own timer, so pytest-timeout's SIGALRM is left alone."""

    def give_up(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"still redacting after {seconds} s of CPU")

    previous = signal.signal(signal.SIGVTALRM, give_up)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


def _random_base64url(size: int) -> str:
    return base64.urlsafe_b64encode(random.Random(0).randbytes(size)).decode()[:size]


PATHOLOGICAL = {
    "hyphenated": ("a-" * SIZE)[:SIZE],
    "dotted": ("a." * SIZE)[:SIZE],
    "eyJ repeated": ("eyJ" * SIZE)[:SIZE],
    "random base64url": _random_base64url(SIZE),
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("reset(7, password='hunter2')", "reset(7, password='[redacted]')"),
        ("kwargs={'api_key': \"k-1\", 'n': 2}", "kwargs={'api_key': \"[redacted]\", 'n': 2}"),
        ('{"password": "hunter2"}', '{"password": "[redacted]"}'),
        ("GET /cb?token=abc123&page=2", "GET /cb?token=[redacted]&page=2"),
        ("redis://:hunter2@cache:6379/0 down", "redis://:[redacted]@cache:6379/0 down"),
        ("Authorization: Bearer abc.def", "Authorization: Bearer [redacted]"),
        (
            "h={'X-Auth-Token': 'abc', 'Accept': 'json'}",
            "h={'X-Auth-Token': '[redacted]', 'Accept': 'json'}",
        ),
        ("set(password=token=abc, n=1)", "set(password=[redacted], n=1)"),
        ("got eyJhbGciOiJIUzI1NiJ9.e30.c2ln back", "got [redacted] back"),
        ("https://alice:s3cret@example.com/x", "https://alice:[redacted]@example.com/x"),
        # An "@" in the password, not percent-encoded: masked whole (it was "ss" left).
        ("redis://:p@ss@cache:6379/0 down", "redis://:[redacted]@cache:6379/0 down"),
        ("redis://u:p@s@s@h/0 and http://x/y@z", "redis://u:[redacted]@h/0 and http://x/y@z"),
    ],
)
def test_it_masks_secret_looking_values_in_text(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_it_leaves_text_without_secrets_alone() -> None:
    text = "3 tests passed: 2 s; lock report:x lost while held (token gone); user_id=7"
    assert redact_text(text) == text


def test_it_masks_the_secret_argument_values_of_four_characters_or_more() -> None:
    # Given arguments with secrets, by name and nested, long and short
    kwargs = {"password": "hunter2", "token": "abc", "user": "bob7", "auth": {"pin": 12345}}

    # When an error text quoting them unnamed is masked
    values = secret_values("no_such_actor", [], kwargs)
    text = mask_values("got hunter2, 12345, abc and bob7", values)

    # Then the long secrets are gone; "abc" is too short to search for
    assert text == "got [redacted], [redacted], abc and bob7"


@pytest.mark.parametrize("kind", PATHOLOGICAL)
def test_it_redacts_pathological_text_in_linear_time(kind: str) -> None:
    # Given 64 KiB that made a pattern backtrack from every word boundary
    text = PATHOLOGICAL[kind]

    # When it is redacted (each log line and stored error goes through this)
    started = time.thread_time()
    with at_most(DOS_BOUND_S):
        redacted = redact_text(text)
        redact(text)

    # Then it took no more CPU than the bound, and there was nothing to mask
    assert time.thread_time() - started < DOS_BOUND_S
    assert redacted == text


@pytest.mark.parametrize(
    "value",
    [
        "redis://:hunter2@cache:6379/0",  # Redis's usual form: no user name
        "postgres://app:hunter2@db/app",
        "amqp://guest:hunter2@rabbit//",
    ],
)
def test_it_masks_a_url_argument_that_carries_a_password(value: str) -> None:
    assert redact({"target": value}) == {"target": "[redacted]"}


def test_it_leaves_a_url_without_a_password_alone() -> None:
    assert redact({"target": "redis://cache:6379/0"}) == {"target": "redis://cache:6379/0"}
