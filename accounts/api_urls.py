from __future__ import annotations

from django.urls import path

from accounts import account_views, views

app_name = "api"
urlpatterns = [
    path("signup/", views.api_signup, name="signup"),
    path("users/<int:user_id>/", views.api_user_profile, name="user_profile"),
    path("users/<int:user_id>/export/", views.api_user_export, name="user_export"),
    path("tasks/<str:task_id>/", views.api_task_status, name="task_status"),
    path("tasks/<str:task_id>/download/", account_views.task_download, name="task_download"),
]
