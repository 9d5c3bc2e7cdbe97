"""A Lua script run by its SHA1 (EVALSHA), loaded on first use by each Redis server.

redis-py's ``register_script`` binds a script to one client; the locks and the
cache take the client as an argument, so this keeps only the text and its hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis import Redis
from redis.exceptions import NoScriptError

ScriptArg = str | bytes | int | float


class LuaScript:
    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: Redis, keys: Sequence[str], args: Sequence[ScriptArg] = ()) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # First use on this server (or after SCRIPT FLUSH / a restart).
            return client.eval(self.source, len(keys), *keys, *args)
