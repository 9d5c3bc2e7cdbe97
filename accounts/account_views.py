"""A signed-up user's side: log in, log out, their account page and their export.

Django's auth views, with the login rate limited per (address, user name) like
signup (``LOGIN_RATE_LIMIT``); the admin's login goes through the same limit.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_GET

from accounts.models import TaskRequest
from accounts.ratelimit import Verdict, login_allowed
from accounts.selectors import TaskNotFound, task_status

LOCKED_OUT = "Too many login attempts. Please try again in a minute."


def _login_verdict(request: HttpRequest) -> Verdict | None:
    """The rate limit's verdict on a login POST; None for any other request."""
    if request.method != "POST":
        return None
    username = request.POST.get("username", "")
    return login_allowed(ip=request.META.get("REMOTE_ADDR", ""), username=username)


class LoginView(auth_views.LoginView):
    template_name = "accounts/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        verdict = _login_verdict(request)
        if verdict is not None and not verdict.allowed:
            form = self.get_form_class()(
                request, initial={"username": request.POST.get("username")}
            )
            response = render(
                request, self.template_name, {"form": form, "error": LOCKED_OUT}, status=429
            )
            response["Retry-After"] = str(verdict.retry_after)
            return response
        return super().post(request, *args, **kwargs)


login = sensitive_post_parameters("password")(LoginView.as_view())
logout = auth_views.LogoutView.as_view()


@sensitive_post_parameters("password")
def admin_login(request: HttpRequest, extra_context: Any = None) -> HttpResponse:
    """The admin's login page behind the same rate limit (its user names are public)."""
    verdict = _login_verdict(request)
    if verdict is not None and not verdict.allowed:
        response = HttpResponse(LOCKED_OUT, status=429, content_type="text/plain")
        response["Retry-After"] = str(verdict.retry_after)
        return response
    return admin.site.login(request, extra_context)


@login_required
def account(request: HttpRequest) -> HttpResponse:
    latest = (
        TaskRequest.objects.filter(requested_by_id=request.user.pk).order_by("-created_at").first()
    )
    return render(
        request,
        "accounts/account.html",
        {"latest_task_id": latest.task_id if latest else "", "user_id": request.user.pk},
    )


@require_GET
def task_download(request: HttpRequest, task_id: str) -> HttpResponse:
    """``GET /api/tasks/<id>/download/``: a finished task's result as a JSON file."""
    if not request.user.is_authenticated:
        return JsonResponse({"errors": {"auth": ["Log in first."]}}, status=401)
    try:
        data = task_status(user_id=request.user.pk, task_id=task_id)
    except TaskNotFound:
        return JsonResponse({"errors": {"task": [f"No task with id {task_id}."]}}, status=404)
    if "result" not in data:
        message = f"The task is {data['status']}; there is no result to download."
        return JsonResponse({"errors": {"task": [message]}}, status=409)
    response = HttpResponse(
        json.dumps(data["result"], indent=2), content_type="application/json; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{data["task"]}-{task_id}.json"'
    return response
