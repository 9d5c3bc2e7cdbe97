from __future__ import annotations

from django.conf import settings
from django.db import models


class TaskRequest(models.Model):
    """Who asked for a task whose result a client may read (``GET /api/tasks/<id>/``).

    Written in the transaction that enqueues the task, so a result is readable
    exactly when its task exists, and only by the user who asked for it.
    """

    task_id = models.CharField(max_length=64, unique=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="task_requests"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"task {self.task_id} for user {self.requested_by_id}"
