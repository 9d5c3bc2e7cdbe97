"""Admin forms that answer a tampered value with a 400 or a form error, not a 500.

Django's admin trusts the ids a change list posts (``_selected_action``): ``abc``
or ``1.5`` reaches ``filter(pk__in=...)`` as a ``ValueError``, and on SQLite an
id past 64 bits is an ``OverflowError`` there and in a many-to-many field's
choices. Found by the hostile-input corpus (tests/security); stock Django
behaviour, so every ModelAdmin of the platform (and the project's User and Group
admins) builds on ``SafeModelAdmin``.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import ValidationError
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

_INT64 = 2**63


def _storable_key(field: models.Field[Any, Any], value: str) -> bool:
    try:
        python = field.to_python(value)
    except (ValidationError, ValueError, TypeError):
        return False
    if isinstance(python, int):
        return -_INT64 <= python < _INT64
    return python is not None


class BoundedModelMultipleChoiceField(forms.ModelMultipleChoiceField):  # type: ignore[type-arg]
    """Refuses a choice id the database could not compare (SQLite: past 64 bits)."""

    def _check_values(self, value: Any) -> Any:
        key = self.to_field_name or "pk"
        queryset = self.queryset
        field = queryset.model._meta.pk if key == "pk" and queryset is not None else None
        if field is not None:
            for item in value:
                if not _storable_key(field, str(item)):
                    raise ValidationError(
                        self.error_messages["invalid_pk_value"],
                        code="invalid_pk_value",
                        params={"pk": item},
                    )
        return super()._check_values(value)  # type: ignore[misc]


class SafeModelAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A ModelAdmin whose tampered action ids and choice ids are refused."""

    # *args: Django 6.1 adds the action's location to the call.
    def response_action(
        self, request: HttpRequest, queryset: Any, *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        field = self.model._meta.pk
        selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
        if field is not None and not all(_storable_key(field, value) for value in selected):
            return HttpResponseBadRequest("The selected ids are not ids of this list.")
        return super().response_action(request, queryset, *args, **kwargs)

    def formfield_for_manytomany(
        self, db_field: Any, request: HttpRequest, **kwargs: Any
    ) -> forms.ModelMultipleChoiceField | None:  # type: ignore[type-arg]
        kwargs.setdefault("form_class", BoundedModelMultipleChoiceField)
        return super().formfield_for_manytomany(db_field, request, **kwargs)
