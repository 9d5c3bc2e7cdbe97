from __future__ import annotations

from django.urls import path

from accounts import account_views, views

app_name = "accounts"
urlpatterns = [
    path("", account_views.account, name="account"),
    path("login/", account_views.login, name="login"),
    path("logout/", account_views.logout, name="logout"),
    path("signup/", views.signup, name="signup"),
    path("signup/done/", views.signup_done, name="signup_done"),
]
