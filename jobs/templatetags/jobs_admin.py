"""Template tags of the job admin: from any object's admin page to its jobs."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import template
from django.urls import reverse

from jobs.ledger.references import referenced_models, subject_key

register = template.Library()


@register.simple_tag
def jobs_of_url(obj: Any) -> str:
    """The job list filtered to ``obj``, if some actor declares arguments naming its model."""
    meta = getattr(obj, "_meta", None)
    if meta is None or obj.pk is None or meta.label_lower not in referenced_models():
        return ""
    query = urlencode({"subject": subject_key(meta.label_lower, obj.pk)})
    return f"{reverse('admin:jobs_job_changelist')}?{query}"


@register.filter
def thousands(value: Any) -> str:
    """12345 -> "12,345": the job list's counts, whatever the locale settings."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)
