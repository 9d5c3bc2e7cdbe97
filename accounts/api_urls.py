from __future__ import annotations

from django.urls import path

from accounts import views

app_name = "api"
urlpatterns = [
    path("signup/", views.api_signup, name="signup"),
    path("users/<int:user_id>/", views.api_user_profile, name="user_profile"),
]
