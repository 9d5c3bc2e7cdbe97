"""``GET /metrics``: Prometheus text format, every process's figures summed.

Open to loopback clients while ``DEBUG`` is on. Otherwise the scraper needs
``Authorization: Bearer <JOBS_METRICS_TOKEN>`` or an address in ``JOBS_METRICS_ALLOWED_IPS``;
anyone else gets 403.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.registry import REGISTRY

from jobs.conf import jobs_settings
from jobs.observability import dead_processes
from jobs.observability.collector import StateCollector, declare_known_series
from jobs.observability.deferred import writes

logger = logging.getLogger(__name__)


def _allowed(request: HttpRequest) -> bool:
    remote = request.META.get("REMOTE_ADDR", "")
    token = jobs_settings.JOBS_METRICS_TOKEN
    if token:
        header = request.headers.get("Authorization", "")
        if hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
            return True
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return False
    if settings.DEBUG and address.is_loopback:
        return True
    return any(
        address in ipaddress.ip_network(net, strict=False)
        for net in jobs_settings.JOBS_METRICS_ALLOWED_IPS
    )


def registry() -> CollectorRegistry:
    declare_known_series()
    writes.flush()  # this process's figures current; the others' within a second
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        try:
            dead_processes.sweep(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        except Exception:
            # A scrape answers whatever the tidying found (an odd file, a full disk).
            logger.exception("Metrics: removing dead processes' live gauges failed")
        combined = CollectorRegistry()
        multiprocess.MultiProcessCollector(combined)  # type: ignore[no-untyped-call]
    else:
        combined = REGISTRY
    state = CollectorRegistry()
    state.register(StateCollector())
    merged = CollectorRegistry()
    for source in (combined, state):
        merged.register(_Proxy(source))
    return merged


class _Proxy:
    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self):  # type: ignore[no-untyped-def]
        return self.source.collect()


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        return HttpResponse(
            "Forbidden: set JOBS_METRICS_TOKEN or JOBS_METRICS_ALLOWED_IPS.", status=403
        )
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
