"""A database that is away answers 503 with Retry-After, never a 500 traceback page.

A PostgreSQL restart or failover drops every connection: the request that hits
it gets a clear "try again" (JSON for the API), the error is logged once as a
warning, and Django opens a fresh connection for the next request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import InterfaceError, OperationalError, close_old_connections
from django.http import HttpRequest, HttpResponse, JsonResponse

logger = logging.getLogger(__name__)
RETRY_AFTER_S = 5


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        logger.warning("Database unavailable, answered 503: %s", exception)
        # The broken connection must not serve the next request of this thread.
        close_old_connections()
        message = "The service is briefly unavailable; try again in a few seconds."
        response: HttpResponse
        if request.path.startswith("/api/"):
            response = JsonResponse({"errors": {"service": [message]}}, status=503)
        else:
            response = HttpResponse(message, status=503, content_type="text/plain")
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
