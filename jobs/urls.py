"""``path("", include("jobs.urls"))``: ``/healthz`` for probes, ``/metrics`` for Prometheus.

The admin's pages (job list, dashboard, schedules) come with ``admin.site.urls``.
"""

from __future__ import annotations

from django.urls import path

from jobs.observability.health import healthz
from jobs.observability.metrics_view import metrics

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
]
