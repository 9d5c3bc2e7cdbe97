"""Which of this worker's slot takes may still hold a slot: the take tokens.

Every script call that may take slots for this process (a fetch with slots,
an ``ACQUIRE``) gets a token, a number that grows with each call, and the
slots it takes are held as ``W:<broker id>:<redis message id>:<token>``
(``jobs.concurrency.slots``). A release names the token of the take it frees,
so a release sent again after its reply was lost cannot free a later take of
the same delivery, and a job fetched again while an earlier take of it is
still held (its release pending through an outage) sees that holder as
another's and waits for it, whichever way it asks for its slot.

This module keeps, per broker id, the takes that may still hold a slot: each
job whose take this process learnt of (until Redis confirms its release), and
each call in flight (its reply not read yet: it may have taken slots this
process has not heard of). Any other token given out before (``settled``)
holds nothing any more, as far as this process knows; a slot Redis still
shows under one was released and then lost by Redis (a failover before the
release reached a replica, a restart with ``appendfsync everysec``), or taken
by a call whose reply was lost. No verdict frees such a slot (its holder is
alive and beating), so this worker's own sweep does (``slots.SWEEP``). An
entry kept too long only keeps its own token's slots (a long job delays no
other's); an entry dropped too early would free a running job's slot, so an
entry leaves only on a reply from Redis, and dropping one twice is harmless.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Takes:
    """The takes of one broker id that may still hold slots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 1
        self._calls: set[int] = set()
        # (message id, token) of each job holding a slot as far as we know.
        self._held: dict[tuple[str, int], None] = {}

    def call(self) -> int:
        """A token for a script call about to take slots; in flight until ``called``."""
        with self._lock:
            token = self._next
            self._next += 1
            self._calls.add(token)
        return token

    def called(self, token: int, taken: Iterable[str] = ()) -> None:
        """The call of ``token`` replied (or failed: ``taken`` empty) and took
        the slots of the jobs with message ids ``taken``."""
        with self._lock:
            for message_id in taken:
                # (str: a message id Dramatiq decoded as a JSON number)
                self._held[(str(message_id), token)] = None
            self._calls.discard(token)

    def released(self, jobs: Iterable[tuple[str, int]]) -> None:
        """Redis ran the releases of these (message id, token) takes."""
        with self._lock:
            for message_id, token in jobs:
                self._held.pop((str(message_id), token), None)

    def settled(self) -> tuple[int, set[int]]:
        """(next, live): every token below ``next`` but those in ``live`` holds
        no slot as far as this process knows."""
        with self._lock:
            # (A sweep a second: a walk over the few hundred jobs a worker holds;
            # their tokens are few, one per fetch.)
            return self._next, self._calls | {token for _, token in self._held}


_by_broker: dict[str, Takes] = {}
_registry_lock = threading.Lock()


def of(broker_id: str) -> Takes:
    """The takes of ``broker_id`` (one per broker instance, so per process)."""
    takes = _by_broker.get(broker_id)
    if takes is None:
        with _registry_lock:
            takes = _by_broker.setdefault(broker_id, Takes())
    return takes


def forget() -> None:
    """Drop every broker's takes (tests: Redis emptied between them)."""
    with _registry_lock:
        _by_broker.clear()
