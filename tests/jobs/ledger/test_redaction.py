"""Secrets in free text (log lines, tracebacks) are masked; other text is left alone."""

from __future__ import annotations

import pytest

from jobs.ledger.redaction import redact_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("reset(7, password='hunter2')", "reset(7, password='[redacted]')"),
        ("kwargs={'api_key': \"k-1\", 'n': 2}", "kwargs={'api_key': \"[redacted]\", 'n': 2}"),
        ('{"password": "hunter2"}', '{"password": "[redacted]"}'),
        ("GET /cb?token=abc123&page=2", "GET /cb?token=[redacted]&page=2"),
        ("redis://:hunter2@cache:6379/0 down", "redis://:[redacted]@cache:6379/0 down"),
        ("Authorization: Bearer abc.def", "Authorization: Bearer [redacted]"),
    ],
)
def test_it_masks_secret_looking_values_in_text(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_it_leaves_text_without_secrets_alone() -> None:
    text = "3 tests passed: 2 s; lock report:x lost while held (token gone); user_id=7"
    assert redact_text(text) == text
