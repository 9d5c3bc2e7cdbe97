"""A form post in another charset than UTF-8 is a 400, not a 500 from gunicorn.

Django 5 refuses ``application/x-www-form-urlencoded`` bodies that are not UTF-8
(``BadRequest`` when ``request.POST`` is read). The CSRF middleware reads it,
then the 400 view's CSRF check reads it again, then the 500 view's: the error
escaped to gunicorn, which answered its own 500 (and no one was told). Answered
here, before the CSRF middleware, it is the client's error it is.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

_FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


def has_foreign_charset(request: HttpRequest) -> bool:
    if request.method in ("GET", "HEAD", "OPTIONS") or request.content_type not in _FORMS:
        return False
    # Exactly what Django accepts: "utf8" or "utf_8" pass Python's codecs but not
    # Django 5's check, and escaped as a 500 too.
    charset = (request.content_params or {}).get("charset", "utf-8").strip().lower()
    return charset != "utf-8"


class RejectForeignFormCharsetMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if has_foreign_charset(request):
            return HttpResponseBadRequest("Form data must be sent as UTF-8.")
        return self.get_response(request)
