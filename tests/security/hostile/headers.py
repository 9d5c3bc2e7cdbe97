"""Headers: Host, sizes, Content-Length and Transfer-Encoding left to the server,
proxies' headers, Accept and friends, cookies, and requests malformed as a whole."""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.security.hostile.base import (
    API,
    CSRF_COOKIE,
    FORM_TYPE,
    JSON_TYPE,
    Corpus,
    Pairs,
    payload,
    signup_form,
)

HOSTS = [
    "evil.example",
    "127.0.0.1:notaport",
    "127.0.0.1:99999999",
    "localhost.",
    "LOCALHOST",
    "[::1]",
    "[::1",
    "evil.example:80@127.0.0.1",
    "127.0.0.1/../",
    "xn--lcalhost-9gg",
    "%31%32%37.0.0.1",
    "127.0.0.1:8000:8000",
    "",
    "127.0.0.1, evil.example",
    "127.0.0.1 evil",
    "a" * 5000,
    "l\u043ecalhost",
]
CONTENT_LENGTHS = {
    "negative": "-1",
    "not a number": "abc",
    "in exponent form": "1e3",
    "with a leading space": " 5",
    "a list": "5, 5",
    "in hex": "0x10",
    "with a plus sign": "+5",
    "past 64 bits": "99999999999999999999",
    "empty": "",
    "larger than the body": "1000",
    "smaller than the body": "2",
}
FORWARDED_FOR = [
    "garbage",
    "::1",
    "unknown",
    "<script>",
    "127.0.0.1",
    "1.2.3.4, 5.6.7.8",
    ", ".join(["1.2.3.4"] * 500),
]
PROXY_HEADERS = [
    ("X-Forwarded-Proto", "https"),
    ("X-Forwarded-Proto", "https, http"),
    ("X-Forwarded-Host", "evil.example"),
    ("X-Forwarded-Port", "99999"),
    ("X-Forwarded-Prefix", "/evil"),
    ("X-Real-IP", "10.0.0.1"),
    ("Forwarded", "for=evil;proto=https;host=evil.example"),
    ("X-Original-URL", "/admin/"),
    ("X-Rewrite-URL", "/admin/"),
    ("X-HTTP-Method-Override", "DELETE"),
]
ACCEPTS = [
    "*/*;q=abc",
    "application/json;q=2",
    "text/html;;;;",
    "application/*+json",
    "image/*",
    ", , ,",
    "text/html; charset=bogus",
    "application/json, text/html;q=0",
    "a" * 5000,
]
STATIC_CONDITIONS = [
    ("Accept-Encoding", "gzip;q=abc"),
    ("Accept-Encoding", "br, gzip, *;q=0"),
    ("Accept-Encoding", "a" * 5000),
    ("Range", "bytes=abc"),
    ("Range", "bytes=999999-"),
    ("Range", "bytes=-0"),
    ("Range", "bytes=5-1"),
    ("Range", "bytes=" + ",".join(f"{i}-{i}" for i in range(500))),
    ("If-None-Match", "garbage"),
    ("If-None-Match", '"' + "a" * 5000 + '"'),
    ("If-Modified-Since", "not a date"),
    ("If-Modified-Since", "Sat, 99 Foo 9999 99:99:99 GMT"),
]
BEARERS = [
    "Bearer",
    "Bearer ",
    "Bearer " + "a" * 5000,
    "Basic YWRtaW46YWRtaW4=",
    "Bearer wrong",
    "bearer wrong",
    "Bearer \u00fcn\u00efcode",
    "Bearer wrong\x7f",
]
LOGGED_VALUES = [
    "0123456789abcdef",
    "a" * 10_000,
    '"},{"level":"CRITICAL","message":"forged',
    "\x1b[31mred",
    "../../",
    "\u00fc",
]
# Whole requests as bytes: what no client library would send.
RAW = {
    "no Host header, HTTP/1.1": "GET /accounts/signup/ HTTP/1.1\r\nConnection: close\r\n\r\n",
    "no Host header, HTTP/1.0": "GET /accounts/signup/ HTTP/1.0\r\n\r\n",
    "an HTTP/0.9 request": "GET /\r\n",
    "an HTTP/2 preface": "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "HTTP/9.9": "GET / HTTP/9.9\r\nHost: {host}\r\n\r\n",
    "a lower-case protocol": "GET / http/1.1\r\nHost: {host}\r\n\r\n",
    "double spaces in the request line": "GET  /accounts/signup/  HTTP/1.1\r\nHost: {host}\r\n\r\n",
    "a tab in the request line": "GET\t/\tHTTP/1.1\r\nHost: {host}\r\n\r\n",
    "a folded header": "GET / HTTP/1.1\r\nHost: {host}\r\nX-A: b\r\n c\r\n\r\n",
    "a space in a header name": "GET / HTTP/1.1\r\nHost: {host}\r\nX Bad: 1\r\n\r\n",
    "a space before the colon": "GET / HTTP/1.1\r\nHost : {host}\r\n\r\n",
    "a header without a colon": "GET / HTTP/1.1\r\nHost: {host}\r\nNoColon\r\n\r\n",
    "an empty header name": "GET / HTTP/1.1\r\nHost: {host}\r\n: x\r\n\r\n",
    "bare LF line ends": "GET /accounts/signup/ HTTP/1.1\nHost: {host}\n\n",
    "a NUL in a header": "GET / HTTP/1.1\r\nHost: {host}\r\nX-A: a\x00b\r\n\r\n",
    "a CR in a header": "GET / HTTP/1.1\r\nHost: {host}\r\nX-A: a\rb\r\n\r\n",
    "a NUL in the path": "GET /\x00 HTTP/1.1\r\nHost: {host}\r\n\r\n",
    "a space in the path": "GET /accounts/ signup/ HTTP/1.1\r\nHost: {host}\r\n\r\n",
    "two pipelined requests": "GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n"
    "GET /accounts/signup/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n",
    "a request smuggled after Content-Length": "POST /api/signup/ HTTP/1.1\r\nHost: {host}\r\n"
    "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    "GET /admin/ HTTP/1.1\r\nHost: {host}\r\n\r\n",
    "an empty request": "\r\n\r\n",
    "garbage bytes (a TLS hello's start)": "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
}


def headers(c: Corpus) -> None:
    def get(why: str, hdrs: Pairs, path: str = "/accounts/signup/", who: str = "anonymous") -> None:
        c.add("headers", why, "GET", path, headers=hdrs, who=who)

    def api(why: str, hdrs: Pairs, body: str | None = None) -> None:
        body = payload(c) if body is None else body
        c.add("headers", why, "POST", API, headers=[JSON_TYPE, *hdrs], body=body)

    nested = "[" * 1500 + "]" * 1500
    for host in HOSTS:
        get(f"Host {host[:30]!r}", [("Host", host)])
        api(f"Host {host[:30]!r} on deeply nested JSON", [("Host", host)], nested)
    get("two Host headers", [("Host", "127.0.0.1"), ("Host", "evil.example")])
    for size in (4000, 8000, 8190, 9000, 16_000, 65_000):
        get(f"a {size:,}-byte header value", [("X-Big", "a" * size)])
    for count in (99, 100, 101, 200, 1000):
        get(f"{count} headers", [(f"X-H{i}", "v") for i in range(count)])
    get("a 300-character header name", [("X-" + "N" * 300, "v")])
    get("forty 1,000-byte headers", [(f"X-K{i}", "k" * 1000) for i in range(40)])
    framing(c, api)
    for value in FORWARDED_FOR:
        for path in ("/metrics", "/"):
            get(f"X-Forwarded-For {value[:30]!r} on {path}", [("X-Forwarded-For", value)], path)
        api(f"X-Forwarded-For {value[:30]!r} on signup", [("X-Forwarded-For", value)])
    for name, value in PROXY_HEADERS:
        get(f"{name}: {value}", [(name, value)])
        get(f"{name}: {value} on /metrics", [(name, value)], "/metrics")
    for value in ACCEPTS:
        for path in ("/api/users/1/", "/accounts/signup/", "/healthz", "/nope/"):
            get(f"Accept {value[:30]!r} on {path}", [("Accept", value)], path)
        get(f"Accept {value[:30]!r} on the admin", [("Accept", value)], "/admin/", who="staff")
    for value in ("a" * 5000, "*;q=x", "zz-ZZ", "de-DE-u-ca-x", "\u00fc"):
        get(f"Accept-Language {value[:30]!r}", [("Accept-Language", value)])
        why = f"Accept-Language {value[:30]!r} on the admin"
        get(why, [("Accept-Language", value)], "/admin/", who="staff")
    for name, value in STATIC_CONDITIONS:
        get(
            f"{name} {value[:30]!r} on a static file", [(name, value)], "/static/admin/css/base.css"
        )
    cookies(c, get)
    for value in BEARERS:
        get(f"Authorization {value[:20]!r} on /metrics", [("Authorization", value)], "/metrics")
    for value in LOGGED_VALUES:
        get(f"X-Request-ID {value[:20]!r}", [("X-Request-ID", value)])
        get(f"User-Agent {value[:20]!r}", [("User-Agent", value)])
    get("a garbage Referer", [("Referer", "http://%%%")])
    api("Origin: null on the JSON API", [("Origin", "null")])
    api("a foreign Origin on the JSON API", [("Origin", "http://evil.example")])
    api("Expect: 100-continue", [("Expect", "100-continue")])
    api("Expect: garbage", [("Expect", "garbage")])
    get("Upgrade: websocket", [("Upgrade", "websocket"), ("Connection", "Upgrade")])
    h2c = [("Upgrade", "h2c"), ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")]
    get("Upgrade: h2c", [*h2c, ("Connection", "Upgrade, HTTP2-Settings")])
    get("Connection: keep-alive", [("Connection", "keep-alive")])
    get("a header with an underscore", [("X_Forwarded_For", "1.2.3.4")], "/metrics")
    api("Content_Length with an underscore", [("Content_Length", "5")])
    for why, raw in RAW.items():
        c.add("headers", why, "RAW", "", raw=raw)


def framing(c: Corpus, api: Callable[..., None]) -> None:
    """Content-Length and Transfer-Encoding as written, for the server to judge."""
    n = c.next()
    short = json.dumps({"username": f"cl{n}", "email": f"cl{n}@example.com", "password": "x"})
    for why, value in CONTENT_LENGTHS.items():
        api(f"Content-Length {why}", [("Content-Length", value)], short)
    length = ("Content-Length", str(len(short.encode())))
    api("two equal Content-Length headers", [length, length], short)
    api("two different Content-Length headers", [length, ("Content-Length", "3")], short)
    get_body = [("Content-Length", "5")]
    c.add("headers", "a body on a GET", "GET", "/api/users/1/", headers=get_body, body="hello")
    chunked = f"{len(short):x}\r\n{short}\r\n0\r\n\r\n"
    te = ("Transfer-Encoding", "chunked")
    for why, hdrs, body in (
        ("a chunked body", [te], chunked),
        ("chunked and Content-Length (smuggling)", [te, ("Content-Length", "4")], chunked),
        ("a bad chunk size", [te], "zz\r\nabc\r\n0\r\n\r\n"),
        ("chunk extensions", [te], "5;a=b\r\nhello\r\n0\r\n\r\n"),
        ("a chunk longer than said", [te], "2\r\nhello\r\n0\r\n\r\n"),
        ("no last chunk", [te], "5\r\nhello\r\n"),
        ("Transfer-Encoding: gzip", [("Transfer-Encoding", "gzip")], short),
        ("chunked, identity", [("Transfer-Encoding", "chunked, identity")], chunked),
        ("Transfer-Encoding: xchunked", [("Transfer-Encoding", "xchunked")], chunked),
        ("a vertical tab before chunked", [("Transfer-Encoding", "\x0bchunked")], chunked),
        ("two Transfer-Encoding headers", [te, ("Transfer-Encoding", "gzip")], chunked),
    ):
        api(why, hdrs, body)
    c.add(
        "headers",
        "Transfer-Encoding on a form post",
        "POST",
        "/accounts/signup/",
        headers=[CSRF_COOKIE, FORM_TYPE, te],
        body="1a\r\ncsrfmiddlewaretoken=abcdef\r\n0\r\n\r\n",
    )


def cookies(c: Corpus, get: Callable[..., None]) -> None:
    for value in ("garbage", "a" * 5000, "\u00fc\u00f1\u00ee", ";", "", "%00"):
        for path in ("/accounts/", "/admin/", "/api/tasks/abc/", "/accounts/signup/done/"):
            why = f"session cookie {value[:20]!r} on {path}"
            get(why, [("Cookie", f"sessionid={value}")], path)
    for order in ("garbage; sessionid={sessionid}", "{sessionid}; sessionid=garbage"):
        why = f"two session cookies: {order}"
        get(why, [("Cookie", f"sessionid={order}")], "/admin/", who="staff")
    get("200 cookies", [("Cookie", "; ".join(f"c{i}=v" for i in range(200)))])
    get("a cookie header of separators", [("Cookie", "=;=;==;;")])
    get("a quoted csrftoken cookie", [("Cookie", 'csrftoken="quoted"')])
    get("a garbage messages cookie", [("Cookie", "messages=abc")], "/admin/login/")
    forged = [("Cookie", "messages=W1siX19qc29uX21lc3NhZ2UiXV0:1abc:xyz")]
    get("a forged messages cookie", forged, "/admin/login/")
    form = signup_form(c)
    for token in ("a" * 10, "!" * 32, "z" * 64, "q" * 1000, "\u00fc" * 32):
        c.add(
            "headers",
            f"CSRF cookie {token[:12]!r}, the same token in the form",
            "POST",
            "/accounts/signup/",
            headers=[("Cookie", f"csrftoken={token}"), FORM_TYPE],
            form=[("csrfmiddlewaretoken", token), *form[1:]],
        )
    for token in ("garbage", "{csrftoken}"):
        c.add(
            "headers",
            f"X-CSRFToken {token!r} on an anonymous export",
            "POST",
            "/api/users/1/export/",
            headers=[CSRF_COOKIE, ("X-CSRFToken", token)],
        )
