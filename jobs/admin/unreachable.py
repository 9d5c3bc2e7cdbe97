"""An operator's action while Redis does not answer: a message, not a 500.

Pausing a queue, cancelling a job or running a schedule now needs Redis. With
Redis down or hung the action says so, on the page it came from, after one
short wait at most (a request's read timeout). A command that timed out may
still have run: the message says that it may have taken effect, and doing it
again is safe (pause and cancel are idempotent, a schedule's "run now" is
claimed per minute). Retrying needs no Redis: it goes through the outbox.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from jobs.consistency.reachability import UNREACHABLE, note_unreachable

MAYBE_DONE = (
    "Redis did not answer in time: this may or may not have taken effect. "
    "Look again once Redis is back; doing it again is safe."
)

View = Callable[..., HttpResponse]


def answers_without_redis(view: View, back: str = "admin:jobs_job_changelist") -> View:
    """``view``, whose POSTs say so when Redis does not answer; back to the page
    they came from, else to the URL named ``back``. The view runs first, so its
    permission check does too; a hung Redis costs it one read timeout at most
    (``jobs.conf.timeouts``)."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        try:
            return view(request, *args, **kwargs)
        except UNREACHABLE as exc:
            note_unreachable(exc)
            # A command may have reached Redis before the connection failed.
            return _back(request, MAYBE_DONE, back)

    return guarded


def _back(request: HttpRequest, notice: str, back: str) -> HttpResponse:
    messages.error(request, notice)
    referer = request.META.get("HTTP_REFERER", "")
    safe = url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return HttpResponseRedirect(referer if safe else reverse(back))
