"""The job page's own controls and read-outs: Retry and Cancel buttons, the
progress bar, and what became of a cancel."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobs.cli.failed import is_permanent as is_permanent_path
from jobs.ledger import audit, operations, states
from jobs.models import Job

LIVE_STATES = (states.ENQUEUED, states.DELAYED, states.RUNNING)


def progress_bar(job: Job) -> SafeString:
    """``<progress>`` with "3 / 5 (60 %): note", or "-" when the job reported none."""
    if job.progress_done is None:
        return format_html("{}", "-")
    done, total = job.progress_done, job.progress_total
    if total:
        share = min(done / total, 1.0)
        text = f"{done:,} / {total:,} ({share:.0%})"
        bar = format_html('<progress value="{}" max="{}"></progress> ', done, total)
    else:
        text, bar = f"{done:,} done", format_html("{}", "")
    note = f": {job.progress_note}" if job.progress_note else ""
    return format_html('{}<span class="job-progress">{}{}</span>', bar, text, note)


def cancellation(job: Job) -> str:
    """Who asked to cancel the job, and what came of it."""
    if job.cancel_requested_at is None:
        return "-"
    who = job.cancelled_by or "an unknown operator"
    asked = f"asked by {who} at {job.cancel_requested_at:%Y-%m-%d %H:%M:%S}"
    if job.state == states.CANCELLED:
        ran = job.started_at is not None and job.started_at < job.cancel_requested_at
        if ran and job.finished_at is not None:
            stopped = (job.finished_at - job.cancel_requested_at).total_seconds()
            how = "by force" if job.error_type == "JobForceCancelled" else "cleanly"
            return f"{asked}; stopped {how} {max(stopped, 0):.1f} s later"
        return f"{asked}; cancelled before it ran"
    if job.state == states.RUNNING:
        waited = (timezone.now() - job.cancel_requested_at).total_seconds()
        return f"{asked}; the job is stopping ({waited:.0f} s so far)"
    if job.state in (states.ENQUEUED, states.DELAYED):
        # It failed (or was put back) before it saw the cancel: its next
        # delivery is skipped.
        return f"{asked}; it will be skipped when it comes due"
    return f"{asked}; too late: the job had already {job.state}"


def can_cancel(job: Job) -> bool:
    return job.state in LIVE_STATES and not (
        job.state == states.RUNNING and job.cancel_requested_at is not None
    )


def can_retry(job: Job) -> bool:
    return (
        job.state == states.FAILED
        and not job.retried_as
        and job.actor_name not in operations.NOT_RETRIABLE
    )


def permanent_failure(job: Job) -> bool:
    """Failed for good (``PermanentJobError``, ``InvalidPayload``): a retry fails again."""
    return job.state == states.FAILED and is_permanent_path(job.error_class_path)


def cancel_one(admin: ModelAdmin[Job], request: HttpRequest, object_id: str) -> HttpResponse:
    if not request.user.has_perm("jobs.cancel_job"):
        return HttpResponse("You may not cancel jobs.", status=403)
    job = get_object_or_404(Job, pk=object_id)
    outcome = operations.cancel_jobs(Job.objects.filter(pk=job.pk), by=request.user.get_username())
    if outcome.done + outcome.requested:
        audit.record(
            "cancel",
            who=audit.who_in(request),
            message_ids=[job.message_id],
            count=outcome.done + outcome.requested,
        )
    if outcome.done:
        admin.message_user(request, "Cancelled: no worker will run it.", messages.SUCCESS)
    elif outcome.requested:
        admin.message_user(
            request,
            "Asked the running job to stop: it stops at its next check, or by force after "
            "the grace period. This page shows when it has.",
            messages.SUCCESS,
        )
    elif outcome.already:
        admin.message_user(request, "Already asked to stop: the job is stopping.", messages.WARNING)
    else:
        job.refresh_from_db()
        admin.message_user(
            request, f"Too late to cancel: the job has already {job.state}.", messages.WARNING
        )
    return redirect(reverse("admin:jobs_job_change", args=[job.pk]))


UNREACHABLE_RETRY = (
    "Redis is not answering: the failed message it keeps cannot be read, so nothing "
    "was sent. Try again once Redis is back."
)


def retry_one(admin: ModelAdmin[Job], request: HttpRequest, object_id: str) -> HttpResponse:
    if not request.user.has_perm("jobs.retry_job"):
        return HttpResponse("You may not retry jobs.", status=403)
    job = get_object_or_404(Job, pk=object_id)
    if permanent_failure(job) and request.POST.get("confirmed") != "yes":
        context = {
            **admin.admin_site.each_context(request),
            "title": "Retry a job that failed for good?",
            "job": job,
            "opts": Job._meta,
        }
        return TemplateResponse(request, "admin/jobs/job/retry_confirm.html", context)
    outcome = operations.retry_jobs(Job.objects.filter(pk=job.pk))
    if outcome.done:
        audit.record(
            "retry", who=audit.who_in(request), message_ids=[job.message_id], count=outcome.done
        )
    if outcome.done:
        text = "Retried: a new job was sent (linked under Payload, 'retries')."
        if outcome.kept:
            text = (
                "Retried: Redis is not answering, so the new job is kept and sent once "
                "it is back (linked under Payload, 'retries')."
            )
        if permanent_failure(job):
            text += " It had failed for good: unless the cause was fixed, it fails again."
        admin.message_user(request, text, messages.SUCCESS)
    elif outcome.already:
        admin.message_user(request, "Already retried: not sent again.", messages.WARNING)
    elif outcome.unreachable:
        admin.message_user(request, UNREACHABLE_RETRY, messages.ERROR)
    else:
        admin.message_user(
            request,
            "Could not retry: not failed, its message and arguments are no longer whole, or "
            "it is a bulk action (start it again from the list).",
            messages.WARNING,
        )
    return redirect(reverse("admin:jobs_job_change", args=[job.pk]))
