"""JSON structure and content for ``POST /api/signup/``."""

from __future__ import annotations

import base64
import gzip
import json
import struct
import zlib
from collections.abc import Callable

from tests.security.hostile.base import API, FIELDS, JSON_TYPE, STRONG, Corpus, payload

NUMBERS = [
    "1e999",
    "-1e999",
    "1e-999",
    "-0",
    "123456789012345678901234567890",
    "1.7976931348623157e309",
    "0x10",
    "01",
    "+1",
    "1.",
    ".5",
    "NaN",
    "Infinity",
    "-Infinity",
    "nan",
    "inf",
    "1e",
    "1_000",
    "1" + "0" * 4300,  # past Python's int-from-string limit (4300 digits)
    "9" * 5000,
]
WRONG_TYPES = [
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1.5",
    "[]",
    "{}",
    '["a"]',
    '""',
    "[null]",
    '{"$ne": null}',
    '" "',
    '{"username": "nested"}',
]
# JSON text of hostile strings, escapes as written: "\ud800" is a lone surrogate.
STRINGS = {
    "a lone high surrogate": r'"\ud800"',
    "a lone low surrogate": r'"\udfff"',
    "a surrogate inside text": r'"a\ud800b"',
    "a reversed surrogate pair": r'"\udc00\ud800"',
    "NUL": r'"\u0000"',
    "NUL inside text": r'"a\u0000b"',
    "control characters": r'"\u0001\u001f\u007f"',
    "CRLF header injection": json.dumps("victim@example.com\r\nBcc: all@example.com"),
    "a right-to-left override": json.dumps("\u202eevil"),
    "a zero-width space": json.dumps("ad\u200bmin"),
    "a BOM inside text": json.dumps("\ufeffadmin"),
    "fullwidth letters": json.dumps("\uff41\uff44\uff4d\uff49\uff4e"),
    "a Cyrillic homoglyph": json.dumps("\u0430dmin"),
    "a hundred combining accents": json.dumps("a\u0301" * 100),
    "a ligature NFKC folds": json.dumps("\ufb01le"),
    "a dotted capital I": json.dumps("ADM\u0130N"),
    "fifty emoji": json.dumps("\U0001f600" * 50),
    "an escaped astral pair": r'"\ud83d\ude00"',
    "line and paragraph separators": json.dumps("a\u2028b\u2029c"),
    "SQL injection": json.dumps("' OR '1'='1' --"),
    "a script tag": json.dumps('"><script>alert(1)</script>'),
    "template syntax": json.dumps("{{ settings.SECRET_KEY }}{% debug %}"),
    "format directives": json.dumps("%s%s%n{0}{password}"),
    "a path traversal": json.dumps("../../../../etc/passwd"),
    "ASCII spelled as escapes": r'"\u0061\u0064\u006d\u0069\u006e"',
    "a short escape": r'"\u00"',
    "an invalid escape": r'"\x41"',
    "a raw tab": '"a\tb"',
    "a raw newline": '"a\nb"',
    "the empty string": '""',
    "spaces only": '"   "',
    "a no-break space only": json.dumps("\u00a0"),
    "a private-use character": json.dumps("\ue000"),
    "noncharacters": json.dumps("\uffff\ufffe"),
    "the last code point": json.dumps("\U0010ffff"),
    "an IDN domain": json.dumps("user@ex\u00e4mple.com"),
    "a non-ASCII local part": json.dumps("\u00fcser@example.com"),
    "several @": json.dumps("a@b@c@example.com"),
    "a quoted local part": json.dumps('"a b"@example.com'),
    "an address literal": json.dumps("user@[127.0.0.1]"),
    "an address past 254 characters": json.dumps("a" * 64 + "@" + "b" * 250 + ".com"),
}
BROKEN = {
    "an empty body": "",
    "a space": " ",
    "a newline": "\n",
    "a lone brace": "{",
    "a string cut short": '{"username": "abc',
    "a value missing": '{"username":',
    "a trailing comma, then the end": '{"a":1,',
    "an array cut short": "[1,2",
    "an unterminated string": '"unterminated',
    "garbage after the object": '{"username": "a"}garbage',
    "two objects": '{"username": "a"}{"username": "b"}',
    "a comment": '/* c */ {"username": "a"}',
    "a trailing comma": '{"username": "a",}',
    "single quotes": "{'username': 'a'}",
    "an unquoted key": '{username: "a"}',
    "a trailing comma in an array": "[1,]",
}
CONTENT_TYPES = [
    None,
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data",
    "multipart/form-data; boundary=x",
    "application/json; charset=utf-16",
    "application/json; charset=bogus",
    "application/json; charset=",
    "APPLICATION/JSON",
    "application/json;;;",
    "application/json, text/plain",
    "application/jsonx",
    "application/json; " + "a=b; " * 500,
    "application/vnd.api+json",
    "text/json",
    "",
    "application/json\t",
]
# Valid signups (the only JSON requests that hash a password), each a trick.
LOOK_ALIKES = {
    "fullwidth admin": "\uff41\uff44\uff4d\uff49\uff4e",
    "Cyrillic a in admin": "\u0430dmin",
    "dotted capital I": "ADM\u0130N",
}


def json_bodies(c: Corpus) -> None:
    def api(why: str, body: str | None = None, *, data: bytes | None = None) -> None:
        c.add("json", why, "POST", API, headers=[JSON_TYPE], body=body, body_bytes=data)

    structure(c, api)
    content(c, api)
    encodings(c, api)
    for content_type in CONTENT_TYPES:
        headers = [] if content_type is None else [("Content-Type", content_type)]
        why = "no Content-Type" if content_type is None else f"Content-Type {content_type[:40]!r}"
        c.add("json", why, "POST", API, headers=headers, body=payload(c))
    two = [JSON_TYPE, ("Content-Type", "text/plain")]
    c.add("json", "two Content-Type headers", "POST", API, headers=two, body=payload(c))
    fuzz(c, api)
    valid_signups(c, api)


def structure(c: Corpus, api: Callable[..., None]) -> None:
    for depth in (100, 999, 1000, 1001, 1500, 3000, 10_000, 30_000):
        api(f"{depth} nested arrays", "[" * depth + "]" * depth)
        api(f"{depth} arrays opened, never closed", "[" * depth)
        if depth <= 10_000:
            nested = "[" * depth + "]" * depth
            api(f"username nested {depth} arrays deep", payload(c, username=nested))
    for depth in (100, 1000, 1500, 5000):
        api(f"{depth} nested objects", '{"a":' * depth + "1" + "}" * depth)
        api(f"{depth} alternating arrays and objects", '[{"a":' * depth + "1" + "}]" * depth)
    n = c.next()
    duplicates = {
        "a duplicate username": '{"username": "a", "username": "b", "email": "d%d@example.com"}',
        "a duplicate email of another type": '{"email": "d%d@example.com", "email": ["x"]}',
        "a duplicate password, the last null": '{"password": "x", "password": null}',
        "a duplicate username, the last an operator": '{"username": "a", "username": {"$gt": ""}}',
        "2,000 duplicate keys": "{"
        + ", ".join(f'"username": "u{i}"' for i in range(2000))
        + ', "email": "d%d@example.com"}',
    }
    for why, body in duplicates.items():
        api(why, body.replace("%d", str(n)))
    for value in WRONG_TYPES:
        for field in FIELDS:
            api(f"{field} as {value}", payload(c, **{field: value}))
    for top in ("[]", '["username"]', '"string"', "123", "null", "true", "false", '[{"a": 1}]'):
        api(f"a top-level {top} instead of an object", top)
    keys = {
        "a NUL key": r'"\u0000"',
        "an empty key": '""',
        "a lone surrogate key": r'"\ud800"',
        "username followed by NUL": r'"username\u0000"',
        "a 10,000-character key": json.dumps("k" * 10_000),
        "a prototype key": '"__proto__"',
    }
    for why, key in keys.items():
        api(why, "{" + key + ': "x", "username": "u", "password": "x"}')
    api("a thousand keys", json.dumps({f"k{i}": i for i in range(1000)}))
    for why, body in BROKEN.items():
        api(why, body)


def content(c: Corpus, api: Callable[..., None]) -> None:
    for number in NUMBERS:
        api(f"the number {number[:24]} as the whole body", number)
        for field in FIELDS:
            api(f"the number {number[:24]} as {field}", payload(c, **{field: number}))
    for name, text in STRINGS.items():
        for field in FIELDS:
            api(f"{field}: {name}", payload(c, **{field: text}))
    for field in FIELDS:
        for size in (151, 255, 10_000):
            api(f"a {size:,}-character {field}", payload(c, **{field: json.dumps("a" * size)}))
    api("a 60,000-character password", payload(c, password=json.dumps("a" * 60_000)))
    too_long = payload(c, username=json.dumps("a" * 70_000))
    api("a 70,000-character username (past the upload limit)", too_long)


def encodings(c: Corpus, api: Callable[..., None]) -> None:
    n = c.next()
    valid = json.dumps({"username": f"enc{n}", "email": f"enc{n}@example.com", "password": "x"})
    bodies = {
        "a UTF-8 BOM": b"\xef\xbb\xbf" + valid.encode(),
        "UTF-16 with a BOM": valid.encode("utf-16"),
        "UTF-16 little-endian": valid.encode("utf-16-le"),
        "UTF-16 big-endian": valid.encode("utf-16-be"),
        "UTF-32 with a BOM": valid.encode("utf-32"),
        "Latin-1 bytes": '{"username": "\u00fc\u00e9"}'.encode("latin-1"),
        "invalid UTF-8": b'{"username": "\xff\xfe"}',
        "an overlong UTF-8 slash": b'{"username": "\xc0\xaf"}',
        "an encoded surrogate (CESU-8)": b'{"username": "\xed\xa0\x80"}',
        "a code point past U+10FFFF": b'{"username": "\xf4\x90\x80\x80"}',
        "ten NUL bytes": b"\x00" * 10,
        "a raw NUL inside a string": b'{"username": "a\x00"}',
        "a lone continuation byte": b"\x80",
        "a multibyte character cut short": b'{"username": "\xe2\x82"}',
        "gzip bytes without Content-Encoding": _gzip_stored(valid.encode()),
    }
    for why, data in bodies.items():
        api(why, data=data)
    c.add(
        "json",
        "gzip with Content-Encoding: gzip (a decompression bomb's shape)",
        "POST",
        API,
        headers=[JSON_TYPE, ("Content-Encoding", "gzip")],
        body_bytes=_gzip_bomb(),
    )


# gzip.compress(b"[" * 200_000, mtime=0) as zlib 1.2 wrote it. A literal: other zlib
# builds (Python 3.13's) compress the same bytes differently, and the corpus file
# must be the same on every interpreter.
_BOMB_B64 = "H4sIAAAAAAACA+3BMQEAAADCoKDr38MM/kAB" + "A" * 257 + "K8BevsspkANAwA="


def _gzip_stored(data: bytes) -> bytes:
    """``data`` as gzip, byte for byte the same on every Python: stored (level 0)
    deflate blocks and a header written here (gzip.compress's XFL and OS bytes
    differ between 3.11 and 3.13)."""
    deflate = zlib.compressobj(0, zlib.DEFLATED, -15)
    body = deflate.compress(data) + deflate.flush()
    header = b"\x1f\x8b\x08\x00" + b"\x00" * 4 + b"\x00\xff"
    trailer = struct.pack("<II", zlib.crc32(data), len(data))
    blob = header + body + trailer
    assert gzip.decompress(blob) == data
    return blob


def _gzip_bomb() -> bytes:
    data = base64.b64decode(_BOMB_B64)
    assert gzip.decompress(data) == b"[" * 200_000
    return data


def fuzz(c: Corpus, api: Callable[..., None]) -> None:
    base = payload(c).encode()
    for i in range(60):
        data = bytearray(base)
        at = c.rng.randrange(len(data))
        if i % 4 == 0:
            data[at] = c.rng.randrange(256)
        elif i % 4 == 1:
            del data[at : at + c.rng.randrange(1, 8)]
        elif i % 4 == 2:
            data[at:at] = bytes(c.rng.randrange(256) for _ in range(c.rng.randrange(1, 4)))
        else:
            data[at:at] = data[c.rng.randrange(len(data)) :][:16]
        api(f"fuzzed byte mutation {i} of a signup body", data=bytes(data))
    for i in range(20):
        noise = bytes(c.rng.randrange(256) for _ in range(c.rng.randrange(1, 200)))
        api(f"random bytes {i}", data=noise)


def valid_signups(c: Corpus, api: Callable[..., None]) -> None:
    for why, name in LOOK_ALIKES.items():
        n = c.next()
        data = {"username": f"{name}{n}", "email": f"trick{n}@example.com", "password": STRONG}
        api(f"a valid signup: {why} in the user name", json.dumps(data))
    n = c.next()
    data = {"username": f"hostile{n}", "email": f"hostile{n}@example.com", "password": STRONG}
    extra = {"is_superuser": True, "is_staff": True, "id": 1, "pk": 1}
    api("a valid signup that asks to be superuser number 1", json.dumps({**data, **extra}))
    n = c.next()
    for email in (f"Dup{n}@Example.com", f"dup{n}@example.com"):
        data = {"username": email.split("@")[0] + "x", "email": email, "password": STRONG}
        api("two signups whose emails differ in case only", json.dumps(data))
    data = {"username": f"same{n}", "email": f"same{n}a@example.com", "password": STRONG}
    api("a valid signup, sent twice", json.dumps(data))
    api("a valid signup, sent twice", json.dumps({**data, "email": f"same{n}b@example.com"}))
