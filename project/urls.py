from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from accounts.account_views import admin_login

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="accounts:signup", permanent=False)),
    path("accounts/", include("accounts.urls")),
    path("api/", include("accounts.api_urls")),
    # the admin's login behind the login rate limit, ahead of admin.site.urls
    path("admin/login/", admin_login, name="admin_login"),
    path("admin/", admin.site.urls),
    # /healthz and /metrics
    path("", include("jobs.urls")),
]

# A database lost while a middleware runs (e.g. saving the session) is a 503 too.
handler500 = "jobs.observability.unavailable.server_error"
