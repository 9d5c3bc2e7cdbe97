"""A URL whose view fails, for the error-report tests."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path


def boom(request: HttpRequest) -> HttpResponse:
    dsn = "postgres://app:frame-secret@db.internal/app"  # a local the report shows
    raise RuntimeError(f"cannot reach {dsn.split('@')[1]}")


urlpatterns = [path("boom/", boom)]
