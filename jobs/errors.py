"""The job error hierarchy: what is retried and what is not.

Raise ``PermanentJobError`` when running the job again cannot help (bad payload,
missing row, an address the mail server refuses): the Retries middleware fails
the message at once. Raise ``Deferred`` when the job cannot start yet (a rate
limit is full): it runs later as the same attempt. Any other exception is
transient and retried with exponential backoff until the attempts run out.
"""

from __future__ import annotations

import dramatiq
from dramatiq.errors import RateLimitExceeded
from dramatiq.middleware import Interrupt

# Message option: how often the current attempt was deferred. It orders the
# ledger's events (a deferral moves the job forward to "delayed") and tells a
# delivery that resumes a deferred attempt from a new attempt.
DEFERRALS = "deferrals"


class JobError(Exception):
    """Base class of the errors raised on purpose by job code."""


class PermanentJobError(JobError):
    """Running the job again cannot succeed; never retried."""


class TransientJobError(JobError):
    """A temporary condition (network, lock busy); retried with backoff."""


class Deferred(dramatiq.Retry):
    """Not a failure: run the message again after ``delay`` ms, as the same attempt.

    The Retries middleware puts it back without using up a retry; the ledger
    shows the job "delayed" and counts no attempt; no retry is counted.
    """


class JobCancelled(Interrupt):
    """An operator cancelled the running job, and it saw so (``jobs.runtime.cancellation.check``).

    A BaseException, as Dramatiq's time limit is: a job's ``except Exception``
    must not swallow the stop. Never retried; the ledger shows "cancelled".
    """

    forced = False


class JobForceCancelled(JobCancelled):
    """The job did not see its cancel within ``JOBS_CANCEL_GRACE_MS``: raised in its
    thread from outside, wherever it was (lands at the next Python bytecode; a
    thread blocked in C code sees it when that call returns)."""

    forced = True


def is_cancel(exc: BaseException | None) -> bool:
    return isinstance(exc, JobCancelled)


def is_permanent(exc: BaseException) -> bool:
    return isinstance(exc, PermanentJobError)


def is_deferral(exc: BaseException | None) -> bool:
    # Dramatiq's own limiters raise RateLimitExceeded (raise_on_failure=True):
    # over a limit is a wait, whichever way the job says so.
    return isinstance(exc, (Deferred, RateLimitExceeded))
