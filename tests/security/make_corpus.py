"""Write ``tests/security/hostile_requests.jsonl``: the hostile-input corpus (issue 30).

    .venv/bin/python -m tests.security.make_corpus          # rewrite the file
    .venv/bin/python -m tests.security.make_corpus --check  # exit 1 if it is stale

One request a line, a JSON object with ``id``, ``category``, ``as`` (``anonymous``
or ``staff``), ``method``, ``path`` (the request target exactly as sent),
``headers`` (name/value pairs, in order, sent as written), at most one of
``body`` (text, sent as UTF-8), ``body_b64`` (raw bytes) or ``form`` (pairs,
url-encoded), or instead ``raw`` (the whole request), optional ``from`` (the
loopback address to send from), and ``why``. ``tests/security/corpus.py`` reads
it and says what the replayer fills in (``{csrftoken}``, ``Host``, ...). The
parts live in ``tests/security/hostile/``, one module per kind of input.

Deterministic: a fixed seed, no clock, no environment, no Django. Run it again
after changing a part; ``test_the_corpus_file_is_what_make_corpus_writes`` fails
until the file matches.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.security.hostile.base import Corpus
from tests.security.hostile.forms import admin_posts, form_posts
from tests.security.hostile.headers import headers
from tests.security.hostile.json_bodies import json_bodies
from tests.security.hostile.urls import admin_queries, methods, paths

OUT = Path(__file__).with_name("hostile_requests.jsonl")
PARTS = (json_bodies, form_posts, admin_posts, methods, paths, headers, admin_queries)


def build() -> Corpus:
    corpus = Corpus()
    for part in PARTS:
        part(corpus)
    return corpus


def main(argv: list[str]) -> int:
    text = build().lines()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python -m tests.security.make_corpus", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {text.count(chr(10))} requests to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
