"""A plain HTTP client over a socket: bytes out as given, the answer parsed by http.client.

Nothing is normalised on the way out (urllib would resolve ``..``, quote the
path and fix headers). The request is followed by a half-close, so a server
waiting for a body that a bad ``Content-Length`` promised sees the end at once.
Each request may come from its own loopback address, which is what the server
sees as ``REMOTE_ADDR``.
"""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass, field
from http.cookies import SimpleCookie


@dataclass
class Answer:
    status: int | None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    error: str = ""

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name.lower()), "")

    def cookies(self) -> dict[str, str]:
        jar: SimpleCookie = SimpleCookie()
        for name, value in self.headers:
            if name.lower() == "set-cookie":
                jar.load(value)
        return {name: morsel.value for name, morsel in jar.items()}


def send(
    port: int, data: bytes, *, method: str = "GET", source: str = "127.0.0.1", timeout: float = 15
) -> Answer:
    try:
        sock = socket.create_connection(
            ("127.0.0.1", port), timeout=timeout, source_address=(source, 0)
        )
    except OSError as exc:
        return Answer(None, error=f"connect: {exc!r}")
    with sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may answer (400) and close before reading everything
        response = http.client.HTTPResponse(sock, method=method)
        try:
            response.begin()
            body = response.read()
        except http.client.IncompleteRead as exc:
            body = exc.partial
        except (OSError, http.client.HTTPException) as exc:
            return Answer(None, error=repr(exc))
        return Answer(response.status, response.getheaders(), body)
