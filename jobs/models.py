from __future__ import annotations

from django.db import models


class EffectRecord(models.Model):
    """One side effect (an email, a report) guarded by an idempotency key.

    A row in state ``running`` is a claim with a lease: a retry that finds an
    expired lease (its worker died mid-effect) may take the claim over.
    """

    class State(models.TextChoices):
        RUNNING = "running", "running"
        DONE = "done", "done"

    key = models.CharField(max_length=200, unique=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    claim_token = models.CharField(max_length=32)
    lease_until = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "idempotent effect"

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"
