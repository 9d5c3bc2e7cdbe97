"""Thin views: parse, validate, call a service, render."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.forms import SignupForm, api_errors, api_form
from accounts.ratelimit import Verdict, signup_allowed
from accounts.selectors import TaskNotFound, UserNotFound, task_status, user_profile
from accounts.services import RegistrationConflict, user_export_request, user_register

API_FIELDS = ("username", "email", "password")


def _rate_limited(request: HttpRequest, email: object) -> Verdict:
    # REMOTE_ADDR is the peer; behind a proxy, set it from the trusted header there.
    ip = request.META.get("REMOTE_ADDR", "")
    return signup_allowed(ip=ip, email=email if isinstance(email, str) else None)


def _too_many(response: HttpResponse, verdict: Verdict) -> HttpResponse:
    response.status_code = 429
    response["Retry-After"] = str(verdict.retry_after)
    return response


@sensitive_post_parameters("password1", "password2")  # kept out of error reports
@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    # Not ``request.POST or None``: an empty POST must still be validated.
    form = SignupForm(request.POST if request.method == "POST" else None)
    if request.method == "POST":
        verdict = _rate_limited(request, request.POST.get("email"))
        if not verdict.allowed:
            kept = {name: request.POST.get(name, "") for name in ("username", "email")}
            context = {
                "form": SignupForm(initial=kept),
                "error": "Too many signups from here. Please try again in a minute.",
            }
            return _too_many(render(request, "accounts/signup.html", context), verdict)
    if request.method == "POST" and form.is_valid():
        try:
            user_register(
                username=form.cleaned_data["username"],
                email=form.cleaned_data["email"],
                password=form.cleaned_data["password1"],
            )
        except RegistrationConflict as conflict:
            form.add_error(conflict.field, conflict.message)
        else:
            request.session["signup_email"] = form.cleaned_data["email"]
            return redirect("accounts:signup_done")
    return render(request, "accounts/signup.html", {"form": form})


def signup_done(request: HttpRequest) -> HttpResponse:
    return render(
        request, "accounts/signup_done.html", {"email": request.session.get("signup_email")}
    )


def _bad_request(errors: dict[str, list[str]]) -> JsonResponse:
    return JsonResponse({"errors": errors}, status=400)


def _parse_json_object(request: HttpRequest) -> dict[str, Any] | JsonResponse:
    if request.content_type != "application/json":
        return _bad_request({"body": ["Content-Type must be application/json."]})
    try:
        payload = json.loads(request.body)
    except RequestDataTooBig:
        return _bad_request({"body": ["Request body is too large."]})
    except (ValueError, UnicodeDecodeError) as exc:
        return _bad_request({"body": [f"Malformed JSON: {exc}"]})
    except RecursionError:
        # json's C decoder recurses once per nesting level: 1,500 "[" in 3 KB is enough.
        return _bad_request({"body": ["Malformed JSON: nested too deeply."]})
    if not isinstance(payload, dict):
        return _bad_request({"body": ["Expected a JSON object."]})
    return payload


def _string_problem(value: object) -> str | None:
    """Why ``value`` cannot be a text field, or None when it can."""
    if not isinstance(value, str):
        return "Must be a string."
    try:
        # JSON's \ud800 escapes decode to lone surrogates, which no database
        # (nor UTF-8) can store: refuse them here as a field error.
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "Contains characters that are not valid text."
    return None


@csrf_exempt  # a JSON API for non-browser clients: no cookie session to ride on
@require_POST
def api_signup(request: HttpRequest) -> HttpResponse:
    payload = _parse_json_object(request)
    if isinstance(payload, JsonResponse):
        return payload
    verdict = _rate_limited(request, payload.get("email"))
    if not verdict.allowed:
        errors = {"__all__": ["Too many signups. Try again later."]}
        return _too_many(JsonResponse({"errors": errors}), verdict)
    field_errors = {
        field: [problem]
        for field in API_FIELDS
        if field in payload and (problem := _string_problem(payload[field]))
    }
    if field_errors:
        return _bad_request(field_errors)
    form = api_form(payload)
    if not form.is_valid():
        return _bad_request(api_errors(form))
    try:
        user = user_register(
            username=form.cleaned_data["username"],
            email=form.cleaned_data["email"],
            password=form.cleaned_data["password1"],
        )
    except RegistrationConflict as conflict:
        return _bad_request({conflict.field: [conflict.message]})
    data = {"id": user.pk, "username": user.get_username(), "email": form.cleaned_data["email"]}
    return JsonResponse({"data": data}, status=201)


@require_GET
def api_user_profile(request: HttpRequest, user_id: int) -> JsonResponse:
    try:
        profile = user_profile(user_id)
    except UserNotFound:
        return JsonResponse({"errors": {"user": [f"No user with id {user_id}."]}}, status=404)
    return JsonResponse({"data": profile})


def _unauthenticated() -> JsonResponse:
    return JsonResponse({"errors": {"auth": ["Log in first."]}}, status=401)


def _may_view_users(request: HttpRequest) -> bool:
    # Staff alone is not enough: an operator who may not view users in the admin
    # must not read one (the superuser included) through an export.
    return request.user.is_staff and request.user.has_perm("auth.view_user")


@require_POST  # session-authenticated, so CSRF-protected like any form post
def api_user_export(request: HttpRequest, user_id: int) -> JsonResponse:
    if not request.user.is_authenticated:
        return _unauthenticated()
    if not (request.user.pk == user_id or _may_view_users(request)):
        return JsonResponse({"errors": {"user": ["You may only export yourself."]}}, status=403)
    if not get_user_model().objects.filter(pk=user_id).exists():
        return JsonResponse({"errors": {"user": [f"No user with id {user_id}."]}}, status=404)
    task_id = user_export_request(requested_by=request.user, user_id=user_id)
    response = JsonResponse({"data": {"id": task_id, "status": "READY"}}, status=202)
    response["Location"] = reverse("api:task_status", args=[task_id])
    return response


@require_GET
def api_task_status(request: HttpRequest, task_id: str) -> JsonResponse:
    if not request.user.is_authenticated:
        return _unauthenticated()
    try:
        data = task_status(user_id=request.user.pk, task_id=task_id)
    except TaskNotFound:
        return JsonResponse({"errors": {"task": [f"No task with id {task_id}."]}}, status=404)
    return JsonResponse({"data": data})
