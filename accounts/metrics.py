"""The product's own Prometheus figures (the platform's are in jobs.observability)."""

from __future__ import annotations

from prometheus_client import Counter

SIGNUPS = Counter("signups_total", "Users registered")
