from __future__ import annotations

from django.contrib import admin
from django_dramatiq.models import Task

from jobs.models import EffectRecord

# django-dramatiq's own Task table is not written here (its AdminMiddleware has
# the state races of upstream issues 105 and 154); hide its empty admin.
if admin.site.is_registered(Task):
    admin.site.unregister(Task)


@admin.register(EffectRecord)
class EffectRecordAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("key", "state", "created_at", "done_at", "lease_until")
    list_filter = ("state",)
    search_fields = ("key",)
    ordering = ("-id",)
    readonly_fields = ("key", "state", "claim_token", "lease_until", "created_at", "done_at")

    def has_add_permission(self, request: object) -> bool:
        return False
