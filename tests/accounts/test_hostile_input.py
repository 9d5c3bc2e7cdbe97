"""Generated hostile bodies: never a 500, every rejection names a field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.django_db

NASTY = [
    "' OR '1'='1",
    "admin'--",
    "1; DROP TABLE auth_user; --",
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "\x00",
    "a\x00b",
    "\u202eevil",
    "😀" * 50,
    "Ω≈ç√∫˜µ≤≥÷",  # noqa: RUF001 - look-alike characters on purpose
    "\ud800",  # a lone surrogate: not encodable as UTF-8
    "x" * 300,
    "  ",
    "user@example.com\r\nBcc: victim@example.com",
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.sampled_from(NASTY),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)
field_values = st.sampled_from(NASTY) | st.text(max_size=200) | json_values
payloads = (
    st.fixed_dictionaries(
        {},
        optional={"username": field_values, "email": field_values, "password": field_values},
    )
    | json_values
)
fuzz = settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
counts: dict[str, int] = {}


def encode(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=True, allow_nan=True).encode()


@fuzz
@given(payload=payloads, raw=st.none() | st.binary(max_size=300))
def test_the_api_never_answers_500_and_names_the_field(
    client: Client, payload: Any, raw: bytes | None
) -> None:
    body = raw if raw is not None else encode(payload)
    response = client.post("/api/signup/", data=body, content_type="application/json")

    counts[str(response.status_code)] = counts.get(str(response.status_code), 0) + 1
    assert response.status_code in (201, 400), response.content
    if response.status_code == 400:
        errors = response.json()["errors"]
        assert errors
        assert all(isinstance(m, str) and m for messages in errors.values() for m in messages)


form_values = st.sampled_from(NASTY) | st.text(max_size=200)


@fuzz
@given(
    data=st.fixed_dictionaries(
        {},
        optional={
            "username": form_values,
            "email": form_values,
            "password1": form_values,
            "password2": form_values,
        },
    )
)
def test_the_form_never_answers_500_and_shows_field_errors(
    client: Client, data: dict[str, str]
) -> None:
    clean = {
        k: v.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for k, v in data.items()
    }
    response = client.post("/accounts/signup/", clean)

    assert response.status_code in (200, 302)
    if response.status_code == 200:
        assert response.context["form"].errors
