"""The audit trail in the admin: every operator action, newest first, read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from jobs.admin.safety import SafeModelAdmin
from jobs.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(SafeModelAdmin):
    list_display = ("at", "who", "source", "action", "target", "count", "note")
    list_filter = ("action", "source")
    search_fields = ("=who", "message_ids", "target")
    search_help_text = "A user name (os:<name> from the CLI), a message id, a queue or an actor."
    date_hierarchy = None
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a trail an operator can edit is no trail
