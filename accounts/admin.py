"""The project's User and Group admins, refusing tampered ids (jobs.admin.safety.SafeModelAdmin)."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User

from jobs.admin.safety import SafeModelAdmin


class SafeUserAdmin(SafeModelAdmin, UserAdmin):  # type: ignore[type-arg]
    pass


class SafeGroupAdmin(SafeModelAdmin, GroupAdmin):  # type: ignore[misc]
    pass


for model, model_admin in ((User, SafeUserAdmin), (Group, SafeGroupAdmin)):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
    admin.site.register(model, model_admin)
