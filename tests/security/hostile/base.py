"""The corpus being built, and the pieces every part of it uses."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Sequence
from typing import Any

SEED = 30
API = "/api/signup/"
JSON_TYPE = ("Content-Type", "application/json")
FORM_TYPE = ("Content-Type", "application/x-www-form-urlencoded")
CSRF_COOKIE = ("Cookie", "csrftoken={csrftoken}")
FIELDS = ("username", "email", "password")
# Passes Django's password validators: a request using it reaches user_register,
# whose hashing (PBKDF2, about a third of a second here) the corpus spends sparingly.
STRONG = "correct-Horse-battery-9"
Pairs = Sequence[tuple[str, str]]


class Corpus:
    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.rng = random.Random(SEED)
        self.serial = 0

    def next(self) -> int:
        """A fresh number, for user names and emails no other request uses."""
        self.serial += 1
        return self.serial

    def add(
        self,
        category: str,
        why: str,
        method: str = "GET",
        path: str = "/",
        *,
        who: str = "anonymous",
        headers: Pairs = (),
        body: str | None = None,
        body_bytes: bytes | None = None,
        form: Pairs | None = None,
        raw: str | None = None,
        source: str | None = None,
    ) -> None:
        entry: dict[str, Any] = {
            "id": len(self.entries) + 1,
            "category": category,
            "as": who,
            "method": method,
            "path": path,
            "headers": [list(header) for header in headers],
        }
        if body is not None:
            entry["body"] = body
        if body_bytes is not None:
            entry["body_b64"] = base64.b64encode(body_bytes).decode()
        if form is not None:
            entry["form"] = [list(pair) for pair in form]
        if raw is not None:
            entry["raw"] = raw
        if source is not None:
            entry["from"] = source
        entry["why"] = why
        self.entries.append(entry)

    def lines(self) -> str:
        return "".join(json.dumps(entry, ensure_ascii=True) + "\n" for entry in self.entries)


def payload(c: Corpus, **raw_fields: str) -> str:
    """A signup object whose named fields hold the given JSON text, as written."""
    n = c.next()
    fields = {
        "username": json.dumps(f"hostile{n}"),
        "email": json.dumps(f"hostile{n}@example.com"),
        "password": json.dumps("x"),  # too weak: the form stops before any hashing
        **raw_fields,
    }
    if "password" in raw_fields and "email" not in raw_fields:
        # A hostile password may well pass the validators: a bad email still
        # keeps the request from becoming a signup.
        fields["email"] = json.dumps(f"not-an-email-{n}")
    return "{" + ", ".join(f'"{name}": {text}' for name, text in fields.items()) + "}"


def signup_form(c: Corpus, **values: str) -> list[tuple[str, str]]:
    n = c.next()
    fields = {
        "csrfmiddlewaretoken": "{csrftoken}",
        "username": f"form{n}",
        "email": f"form{n}@example.com",
        "password1": "x",
        "password2": "x",
        **values,
    }
    return list(fields.items())


def login_form(c: Corpus, **values: str) -> list[tuple[str, str]]:
    fields = {
        "csrfmiddlewaretoken": "{csrftoken}",
        "username": f"nobody{c.next()}",
        # Empty: the form stops before authenticate() and its hashing (a third
        # of a second each; the rate limit counts the attempt all the same).
        "password": "",
        **values,
    }
    return list(fields.items())


def without(pairs: Pairs, name: str) -> list[tuple[str, str]]:
    return [(key, value) for key, value in pairs if key != name]
