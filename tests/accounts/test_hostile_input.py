"""Generated hostile bodies: never a 500, every rejection names a field.

Run with the shipped defaults, the signup rate limit included (it reads the
email before any validation, so it sees every hostile value first). Each example
comes from its own client address, so most reach the form while the per-email
budget still answers some with 429.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote_from_bytes

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
client_ips = st.ip_addresses(v=4).map(str)


def assert_rejection_names_a_field(errors: dict[str, list[str]]) -> None:
    assert errors
    assert all(isinstance(m, str) and m for messages in errors.values() for m in messages)


def encode(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=True, allow_nan=True).encode()


@fuzz
@given(payload=payloads, raw=st.none() | st.binary(max_size=300), ip=client_ips)
def test_the_api_never_answers_500_and_names_the_field(
    client: Client, payload: Any, raw: bytes | None, ip: str
) -> None:
    body = raw if raw is not None else encode(payload)
    response = client.post(
        "/api/signup/", data=body, content_type="application/json", REMOTE_ADDR=ip
    )

    counts[str(response.status_code)] = counts.get(str(response.status_code), 0) + 1
    assert response.status_code in (201, 400, 429), response.content
    if response.status_code != 201:
        assert_rejection_names_a_field(response.json()["errors"])


form_values = st.sampled_from(NASTY) | st.text(max_size=200)


def form_body(data: dict[str, str]) -> str:
    # What a hostile client can put on the wire: any bytes, lone surrogates as
    # their (invalid) UTF-8 bytes, NUL percent-encoded.
    return "&".join(
        f"{key}={quote_from_bytes(value.encode('utf-8', 'surrogatepass'))}"
        for key, value in data.items()
    )


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
    ),
    ip=client_ips,
)
def test_the_form_never_answers_500_and_shows_field_errors(
    client: Client, data: dict[str, str], ip: str
) -> None:
    response = client.post(
        "/accounts/signup/",
        form_body(data),
        content_type="application/x-www-form-urlencoded",
        REMOTE_ADDR=ip,
    )

    assert response.status_code in (200, 302, 429)
    if response.status_code == 200:
        assert response.context["form"].errors
    if response.status_code == 429:
        assert "Too many signups" in response.content.decode()


# The fuzz above may or may not draw a given value; these are always tried, in
# every field, with the rate limiter on (a lone surrogate in the email once
# crashed the limiter's key hashing with a 500).
@pytest.mark.parametrize("value", NASTY)
@pytest.mark.parametrize("field", ["username", "email", "password"])
def test_every_known_hostile_value_in_every_api_field_gets_a_field_error(
    client: Client, field: str, value: str
) -> None:
    payload = {"username": "ada", "email": "ada@example.com", "password": "correct-horse-9"}
    payload[field] = value

    response = client.post("/api/signup/", data=encode(payload), content_type="application/json")

    assert response.status_code in (201, 400), response.content
    if response.status_code == 400:
        assert_rejection_names_a_field(response.json()["errors"])


@pytest.mark.parametrize("value", NASTY)
@pytest.mark.parametrize("field", ["username", "email", "password1", "password2"])
def test_every_known_hostile_value_in_every_form_field_gets_a_form_error(
    client: Client, field: str, value: str
) -> None:
    data = {
        "username": "ada",
        "email": "ada@example.com",
        "password1": "correct-horse-9",
        "password2": "correct-horse-9",
    }
    data[field] = value

    response = client.post(
        "/accounts/signup/", form_body(data), content_type="application/x-www-form-urlencoded"
    )

    assert response.status_code in (200, 302)
    if response.status_code == 200:
        assert response.context["form"].errors
