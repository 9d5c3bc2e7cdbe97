from __future__ import annotations

from django.db import models

from jobs.ledger import states


class Job(models.Model):
    """One Dramatiq message and what became of it: the job ledger.

    Written by ``jobs.middleware.ledger.Ledger``. ``progress`` orders the events
    of one message (``jobs.ledger.writer.progress_of``); a write only applies when it
    moves progress forward, so a late "enqueued" never overwrites "running" and
    a terminal state is never left.
    """

    class State(models.TextChoices):
        ENQUEUED = states.ENQUEUED, "enqueued"
        DELAYED = states.DELAYED, "delayed"
        RUNNING = states.RUNNING, "running"
        SUCCEEDED = states.SUCCEEDED, "succeeded"
        FAILED = states.FAILED, "failed"
        SKIPPED = states.SKIPPED, "skipped"
        CANCELLED = states.CANCELLED, "cancelled"

    message_id = models.CharField(max_length=36, unique=True)
    actor_name = models.CharField(max_length=200, db_index=True)
    queue_name = models.CharField(max_length=200, db_index=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.ENQUEUED)
    progress = models.BigIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0, help_text="attempts started so far")
    max_attempts = models.PositiveIntegerField(default=1)
    args = models.JSONField(default=list, blank=True, help_text="secret-looking values redacted")
    kwargs = models.JSONField(default=dict, blank=True)
    options = models.JSONField(default=dict, blank=True)
    redis_message_id = models.CharField(max_length=36, blank=True, default="")
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True, help_text="start of the last attempt")
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(
        null=True, blank=True, help_text="of the last attempt"
    )
    next_retry_at = models.DateTimeField(null=True, blank=True)
    worker_host = models.CharField(max_length=200, blank=True, default="")
    worker_pid = models.PositiveIntegerField(null=True, blank=True)
    error_type = models.CharField(max_length=200, blank=True, default="")
    error_class_path = models.CharField(max_length=300, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    # Kept only for actors that ask for it (Django tasks): JSON, size-capped.
    return_value = models.JSONField(null=True, blank=True)
    skip_reason = models.CharField(max_length=200, blank=True, default="")
    # Who asked to cancel the job and when (the admin, ``manage.py jobs cancel``).
    # Nullable without a default, like retried_as: no table rebuild on SQLite.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.CharField(max_length=150, null=True, blank=True)  # noqa: DJ001
    # What the job reported of its progress (jobs.runtime.progress). Not the
    # ``progress`` column above: that one orders the ledger's writes.
    progress_done = models.PositiveBigIntegerField(null=True, blank=True)
    progress_total = models.PositiveBigIntegerField(null=True, blank=True)
    progress_note = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    progress_at = models.DateTimeField(null=True, blank=True)
    # The retry sent for this failed job, claimed before it is sent, so two
    # operators (or a double click) retrying the same job send it once. NULL
    # rather than "": adding a nullable column without a default is cheap on a
    # large SQLite ledger (no table rebuild).
    retried_as = models.CharField(max_length=36, null=True, blank=True)  # noqa: DJ001
    # By message id and without a constraint: the original may be pruned first.
    retry_of = models.ForeignKey(
        "self",
        to_field="message_id",
        null=True,
        blank=True,
        db_constraint=False,
        on_delete=models.DO_NOTHING,
        related_name="retries",
    )

    class Meta:
        ordering = ("-id",)
        permissions = [
            ("retry_job", "Can retry failed jobs"),
            ("cancel_job", "Can cancel jobs"),
            ("pause_queue", "Can pause and resume queues"),
            ("run_periodic", "Can run periodic jobs now"),
        ]
        indexes = [
            models.Index(fields=["state", "-id"], name="jobs_job_state_id"),
            models.Index(fields=["enqueued_at"], name="jobs_job_enqueued_at"),
            # Counts per state over a time range without reading the table.
            models.Index(fields=["state", "enqueued_at"], name="jobs_job_state_enqueued"),
            # Covers the dashboard's charts (counts and duration histograms per
            # minute, hour, actor) so they never read the table itself.
            models.Index(
                fields=["state", "finished_at", "actor_name", "duration_ms", "attempts"],
                name="jobs_job_finished_cover",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.actor_name} {self.message_id} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in states.TERMINAL_STATES


class JobReference(models.Model):
    """An object a job's arguments name, as its actor declares (``refers_to``).

    One row per declared reference, so every object a job names finds it, in
    ``jobs.ledger.references``' form (``auth.user:7``). Written by the ledger
    with the job's row; deleted with it.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="references")
    subject = models.CharField(max_length=200)

    class Meta:
        constraints = [
            # Also one object's jobs, newest first (job_id descending).
            models.UniqueConstraint(fields=["subject", "job"], name="jobs_reference_subject_job"),
        ]

    def __str__(self) -> str:
        return f"{self.subject} in job {self.job_id}"


class JobAttempt(models.Model):
    """A failed attempt of a job: kept so every attempt's error stays visible."""

    job = models.ForeignKey(
        Job, to_field="message_id", on_delete=models.CASCADE, related_name="failures"
    )
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    error_type = models.CharField(max_length=200)
    error_class_path = models.CharField(max_length=300, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    worker_host = models.CharField(max_length=200, blank=True, default="")
    worker_pid = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ("number",)
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="jobs_attempt_unique_number"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.job_id}: {self.error_type}"


class EffectRecord(models.Model):
    """One side effect (an email, a report) guarded by an idempotency key.

    A row in state ``running`` is a claim. ``holder`` is the broker id of the
    worker process that made it: once that worker's heartbeat is older than the
    broker's timeout (its messages are being redelivered), a retry takes the
    claim over at once. A claim without a holder (made outside a worker) waits
    for its lease to expire instead. ``job_id`` is the message that made the
    claim: the ledger reads it to tell a job whose effect is done.
    """

    class State(models.TextChoices):
        RUNNING = "running", "running"
        DONE = "done", "done"

    key = models.CharField(max_length=200, unique=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    claim_token = models.CharField(max_length=32)
    lease_until = models.DateTimeField()
    holder = models.CharField(max_length=64, blank=True, default="")
    job_id = models.CharField(max_length=36, blank=True, default="", db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "idempotent effect"

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"


class DailyReport(models.Model):
    """The figures of one day, produced once per date by the ``daily_report`` job."""

    date = models.DateField(unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    figures = models.JSONField(default=dict)
    text = models.TextField()
    html = models.TextField()
    emailed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-date",)

    def __str__(self) -> str:
        return f"Report for {self.date.isoformat()}"


class OutboxMessage(models.Model):
    """A message to publish, written in the transaction that asked for it.

    ``jobs.consistency.outbox.send_on_commit`` inserts the row with the caller's transaction;
    after commit it is published at once, or by the relay in the worker processes
    once the broker is reachable again. ``claimed_until`` lets several relays run
    without publishing one row twice.
    """

    message_id = models.CharField(max_length=36, unique=True)
    actor_name = models.CharField(max_length=200)
    queue_name = models.CharField(max_length=200)
    payload = models.JSONField(help_text="the Dramatiq message, as sent")
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["sent_at", "id"], name="jobs_outbox_pending")]

    def __str__(self) -> str:
        return f"{self.actor_name} {self.message_id} ({'sent' if self.sent_at else 'pending'})"


class JobCheckpoint(models.Model):
    """A completed step of a job, so a retry resumes after it (``jobs.consistency.checkpoints``)."""

    message_id = models.CharField(max_length=36)
    step = models.CharField(max_length=100)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("id",)
        constraints = [
            models.UniqueConstraint(fields=["message_id", "step"], name="jobs_checkpoint_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} step {self.step}"


class ScheduleOverride(models.Model):
    """An operator's change to a periodic job's schedule, made in the admin.

    The code's ``periodic=cron(...)`` is the default; a row here overrides it
    (another cron expression, or switched off) until reset, which deletes the
    row. Schedulers read the rows each minute, so an edit needs no deploy.
    """

    actor_name = models.CharField(max_length=200, unique=True)
    cron = models.CharField(max_length=100, blank=True, default="", help_text="empty: the code's")
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.actor_name}: {self.cron or 'default'}{'' if self.enabled else ' (off)'}"


class AuditEntry(models.Model):
    """One operator action: who did what, when, to which jobs (one row per action).

    Written by the admin's actions and buttons and by ``manage.py jobs``; a
    job's page lists the entries that name it. ``message_ids`` keeps the first
    ``jobs.admin.audit.MAX_IDS`` ids of the jobs acted on; an action on every
    match of a filter keeps the filter as well.
    """

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    who = models.CharField(max_length=150, help_text="user name, or os:<user> from the CLI")
    source = models.CharField(max_length=10, default="admin")  # admin | cli
    action = models.CharField(max_length=40)
    target = models.CharField(max_length=300, blank=True, default="")  # queue, actor or filter
    count = models.PositiveIntegerField(default=0)
    message_ids = models.TextField(blank=True, default="")  # space-separated
    note = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ("-id",)
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.who} {self.action} ({self.count})"
