from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import UserCreationForm

User = get_user_model()


class SignupForm(UserCreationForm):  # type: ignore[type-arg]
    """Username, email and password twice; Django's password validators apply.

    Only validates: ``accounts.services.user_register`` creates the user, since it
    owns the transaction and the enqueue (never call ``save()``).
    """

    email = forms.EmailField(
        max_length=254,
        help_text="We send a welcome message here.",
        widget=forms.EmailInput(attrs={"autocomplete": "email"}),
    )

    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username", "email")

    def clean_email(self) -> str:
        email: str = self.cleaned_data["email"].strip()
        if User.objects.filter(email__iexact=email).exists():
            raise forms.ValidationError("A user with that email already exists.", code="unique")
        return email


def api_form(payload: dict[str, Any]) -> SignupForm:
    """The same validation for the JSON API, which takes one ``password``."""
    password = payload.get("password")
    return SignupForm(
        data={
            "username": payload.get("username"),
            "email": payload.get("email"),
            "password1": password,
            "password2": password,
        }
    )


def api_errors(form: SignupForm) -> dict[str, list[str]]:
    """Form errors keyed by the API's field names (``password`` for both)."""
    errors: dict[str, list[str]] = {}
    for field, messages in form.errors.items():
        name = "password" if field in ("password1", "password2") else field
        for message in messages:
            if str(message) not in errors.setdefault(name, []):
                errors[name].append(str(message))
    return errors
