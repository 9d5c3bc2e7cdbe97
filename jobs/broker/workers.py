"""Worker presence: each worker process refreshes a key with a TTL while alive."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

from jobs.broker import redis_broker

PREFIX = "jobs:worker:"
TTL_SECONDS = 30
BEAT_SECONDS = 10


def _key() -> str:
    return f"{PREFIX}{socket.gethostname()}:{os.getpid()}"


def beat() -> None:
    redis_broker().client.set(_key(), "1", ex=TTL_SECONDS)


def gone() -> None:
    redis_broker().client.delete(_key())


def live_workers() -> list[str]:
    client = redis_broker().client
    return sorted(
        k.decode()[len(PREFIX) :] for k in client.scan_iter(match=f"{PREFIX}*", count=500)
    )


class Heartbeat:
    """A daemon thread that beats every ``BEAT_SECONDS`` until stopped."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="jobs-heartbeat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        with contextlib.suppress(Exception):  # Redis down: the key expires on its own
            gone()

    def _run(self) -> None:
        while not self.stopping.is_set():
            # A failed beat is retried next time; a long outage shows as "worker absent".
            with contextlib.suppress(Exception):
                beat()
            self.stopping.wait(BEAT_SECONDS)
