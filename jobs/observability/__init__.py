"""Metrics, the /metrics and /healthz views, and structured log context."""
