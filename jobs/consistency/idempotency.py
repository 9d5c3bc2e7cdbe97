"""Run a side effect once per idempotency key, even under duplicate delivery.

    sent = run_once(f"welcome-email:{user.pk}", message.send)

The key is claimed in the database before the effect (a unique row with a
lease), the effect runs outside any transaction, and the claim is marked done
after. A concurrent duplicate sees the live claim and is retried later; a
failed effect releases its claim so the retry can run it; a worker killed
mid-effect leaves a claim whose lease expires, after which a retry takes over.
The one window left is a crash between the effect and marking it done: the
effect may then run again after the lease (at-least-once, never lost).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.errors import TransientJobError
from jobs.models import EffectRecord

logger = logging.getLogger(__name__)

DEFAULT_LEASE = timedelta(minutes=10)


class EffectInProgress(TransientJobError):
    """Another worker holds a live claim on this key; retry later."""


def _claim(key: str, token: str, lease: timedelta) -> bool:
    """Claim ``key``; return False if its effect is already done."""
    now = timezone.now()
    try:
        with transaction.atomic():
            EffectRecord.objects.create(key=key, claim_token=token, lease_until=now + lease)
        return True
    except IntegrityError:
        pass
    record = EffectRecord.objects.filter(key=key).values("state", "lease_until").first()
    if record is None:  # released between our insert and our read: try once more
        return _claim(key, token, lease)
    if record["state"] == EffectRecord.State.DONE:
        return False
    # Take over an expired claim; the conditional update settles races between
    # two workers that both saw it expire.
    taken = EffectRecord.objects.filter(
        key=key, state=EffectRecord.State.RUNNING, lease_until__lt=now
    ).update(claim_token=token, lease_until=now + lease)
    if taken:
        logger.warning("Took over expired claim on %s", key)
        return True
    raise EffectInProgress(f"effect {key!r} is being run by another worker")


@contextmanager
def once_atomic(key: str) -> Iterator[bool]:
    """Exactly once for database effects: the key and the effect commit together.

        with once_atomic(f"invoice:{order_id}") as first:
            if first:
                Invoice.objects.create(...)

    Yields False (and the block should do nothing) when the key was used before.
    A crash before commit rolls back both; a duplicate delivery waits on the
    unique key, then sees it taken.
    """
    with transaction.atomic():
        try:
            with transaction.atomic():
                EffectRecord.objects.create(
                    key=key,
                    state=EffectRecord.State.DONE,
                    claim_token="atomic",
                    lease_until=timezone.now(),
                    done_at=timezone.now(),
                )
        except IntegrityError:
            yield False
            return
        yield True


def run_once(key: str, effect: Callable[[], object], *, lease: timedelta = DEFAULT_LEASE) -> bool:
    """Run ``effect`` unless it already ran under ``key``; True if it ran now."""
    token = secrets.token_hex(16)
    if not _claim(key, token, lease):
        logger.info("Effect %s already done; skipped", key)
        return False
    try:
        effect()
    except BaseException:
        EffectRecord.objects.filter(key=key, claim_token=token).delete()
        raise
    EffectRecord.objects.filter(key=key, claim_token=token).update(
        state=EffectRecord.State.DONE, done_at=timezone.now()
    )
    return True
