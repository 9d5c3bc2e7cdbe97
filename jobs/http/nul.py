"""A NUL character in a URL is a 400, not a 500.

PostgreSQL cannot hold NUL in text: psycopg raises ``ValueError`` for any query
parameter that carries one, so ``/api/tasks/%00/`` or an admin filter such as
``?actor=%00`` ended as a 500 (SQLite stores NUL and never failed). Nothing a
client sends in a path or query string needs it. Form fields are Django's
business: its ``CharField`` refuses NUL with a field error already.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest


def has_nul(request: HttpRequest) -> bool:
    # Cookies too: Python's cookie parser turns "\000" into NUL, and a session
    # id with one failed the session lookup on PostgreSQL.
    return (
        "\x00" in request.path
        or any(
            "\x00" in key or any("\x00" in value for value in values)
            for key, values in request.GET.lists()
        )
        or any("\x00" in key or "\x00" in value for key, value in request.COOKIES.items())
    )


class RejectNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if has_nul(request):
            return HttpResponseBadRequest("A NUL character is not allowed in a URL.")
        return self.get_response(request)
