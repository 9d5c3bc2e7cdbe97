"""The hostile-input corpus (``hostile_requests.jsonl``) read back and turned into bytes.

Each request is sent exactly as written: the target is not normalised, headers
keep their order, case and duplicates. The replayer only fills in what a
request leaves out, so that an odd value in the file always reaches the server:

- ``Host: <the server>`` unless the request has a Host header (or is ``raw``);
- ``Content-Length`` for a body, unless it sets Content-Length or Transfer-Encoding;
- ``Content-Type: application/x-www-form-urlencoded`` for a ``form``, unless set;
- ``Connection: close`` unless it sets Connection;
- a staff request without a Cookie header gets the staff user's session and
  CSRF cookies.

Placeholders, in the target, header values, bodies and form values:
``{csrftoken}`` (the identity's CSRF cookie), ``{sessionid}`` (the staff user's
session), ``{staff_id}`` (the staff user's id) and ``{host}``.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

CORPUS = Path(__file__).with_name("hostile_requests.jsonl")


@dataclass(frozen=True)
class Identity:
    """Who sends a request: the values its placeholders take."""

    csrftoken: str = ""
    sessionid: str = ""
    staff_id: str = ""

    def fill(self, text: str, host: str) -> str:
        for name, value in (
            ("{csrftoken}", self.csrftoken),
            ("{sessionid}", self.sessionid),
            ("{staff_id}", self.staff_id),
            ("{host}", host),
        ):
            text = text.replace(name, value)
        return text


@dataclass(frozen=True)
class HostileRequest:
    id: int
    category: str
    who: str
    method: str
    path: str
    why: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | None = None
    form: list[tuple[str, str]] | None = None
    raw: str | None = None
    source: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostileRequest:
        body = None
        if "body" in data:
            body = data["body"].encode("utf-8")
        elif "body_b64" in data:
            body = base64.b64decode(data["body_b64"])
        return cls(
            id=data["id"],
            category=data["category"],
            who=data["as"],
            method=data["method"],
            path=data["path"],
            why=data["why"],
            headers=[(name, value) for name, value in data["headers"]],
            body=body,
            form=[(name, value) for name, value in data["form"]] if "form" in data else None,
            raw=data.get("raw"),
            source=data.get("from"),
        )

    def encode(self, identity: Identity, host: str) -> bytes:
        """The request's bytes on the wire, placeholders filled in."""
        if self.raw is not None:
            return identity.fill(self.raw, host).encode("utf-8")
        headers = [(name, identity.fill(value, host)) for name, value in self.headers]
        names = {name.lower() for name, _ in headers}
        body = self.body
        if body is not None:
            body = identity.fill(body.decode("utf-8", "surrogateescape"), host).encode(
                "utf-8", "surrogateescape"
            )
        if self.form is not None:
            pairs = [(name, identity.fill(value, host)) for name, value in self.form]
            body = urlencode(pairs).encode("ascii")
            if "content-type" not in names:
                headers.append(("Content-Type", "application/x-www-form-urlencoded"))
        if self.who == "staff" and "cookie" not in names:
            cookie = f"sessionid={identity.sessionid}; csrftoken={identity.csrftoken}"
            headers.append(("Cookie", cookie))
        if "host" not in names:
            headers.insert(0, ("Host", host))
        if body is not None and not names & {"content-length", "transfer-encoding"}:
            headers.append(("Content-Length", str(len(body))))
        if "connection" not in names:
            headers.append(("Connection", "close"))
        target = identity.fill(self.path, host)
        head = f"{self.method} {target} HTTP/1.1\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers)
        return (head + "\r\n").encode("utf-8") + (body or b"")

    def describe(self) -> str:
        target = self.path if len(self.path) <= 120 else self.path[:120] + "..."
        return f"#{self.id} [{self.category}, {self.who}] {self.method} {target!r}: {self.why}"


def load(path: Path = CORPUS) -> list[HostileRequest]:
    with path.open(encoding="ascii") as lines:
        return [HostileRequest.from_json(json.loads(line)) for line in lines if line.strip()]


def sizes(requests: list[HostileRequest]) -> Counter[str]:
    return Counter(request.category for request in requests)
