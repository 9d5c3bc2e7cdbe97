"""The job error hierarchy: what is retried and what is not.

Raise ``PermanentJobError`` when running the job again cannot help (bad payload,
missing row, an address the mail server refuses): the Retries middleware fails
the message at once. Any other exception is transient and retried with
exponential backoff until the attempts run out.
"""

from __future__ import annotations


class JobError(Exception):
    """Base class of the errors raised on purpose by job code."""


class PermanentJobError(JobError):
    """Running the job again cannot succeed; never retried."""


class TransientJobError(JobError):
    """A temporary condition (network, lock busy); retried with backoff."""


def is_permanent(exc: BaseException) -> bool:
    return isinstance(exc, PermanentJobError)
