"""Subprocess side of the lock tests: ``python -m tests.jobs.consistency.lock_helper MODE ...``.

increment USER_ID N LOCKED   read-modify-write ``last_name`` N times, under the lock or not
hold NAME TTL                take the lock (with renewal), print "held", sleep until killed
"""

from __future__ import annotations

import sys
import time

import django


def increment(user_id: int, times: int, locked: bool) -> None:
    from django.contrib.auth.models import User

    from jobs.consistency.locks import redis_lock

    def once() -> None:
        value = int(User.objects.get(pk=user_id).last_name)
        time.sleep(0.0005)  # widens the read-modify-write window without the lock
        User.objects.filter(pk=user_id).update(last_name=str(value + 1))

    for _ in range(times):
        if locked:
            with redis_lock(f"counter:{user_id}", ttl=5, wait=60):
                once()
        else:
            once()


def hold(name: str, ttl: float) -> None:
    from jobs.consistency.locks import redis_lock

    with redis_lock(name, ttl=ttl, wait=5):
        print("held", flush=True)
        time.sleep(3600)


if __name__ == "__main__":
    django.setup()
    mode, *args = sys.argv[1:]
    if mode == "increment":
        increment(int(args[0]), int(args[1]), args[2] == "1")
    else:
        hold(args[0], float(args[1]))
