"""An operator's action while Redis does not answer: a message, not a 500.

Pausing a queue, cancelling a job or running a schedule now needs Redis. With
Redis down or hung the action says so, on the page it came from, after one
short wait at most (``jobs.consistency.reachability`` spares the next ones).
A command that timed out may still have run: the message says that it may have
taken effect, and doing it again is safe (pause and cancel are idempotent, a
schedule's "run now" is claimed per minute). Retrying needs no Redis: it goes
through the outbox.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.http import url_has_allowed_host_and_scheme

from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable

NOTHING_DONE = "Redis is not answering: nothing was changed. Try again once it is back."
MAYBE_DONE = (
    "Redis did not answer in time: this may or may not have taken effect. "
    "Look again once Redis is back; doing it again is safe."
)

View = Callable[..., HttpResponse]


def answers_without_redis(view: View) -> View:
    """``view``, whose POSTs say so while Redis does not answer."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        if recently_unreachable():
            return _back(request, NOTHING_DONE)
        try:
            return view(request, *args, **kwargs)
        except UNREACHABLE as exc:
            note_unreachable(exc)
            # A command may have reached Redis before the connection failed.
            return _back(request, MAYBE_DONE)

    return guarded


def _back(request: HttpRequest, notice: str) -> HttpResponse:
    messages.error(request, notice)
    referer = request.META.get("HTTP_REFERER", "")
    safe = url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return HttpResponseRedirect(referer if safe else request.get_full_path())
