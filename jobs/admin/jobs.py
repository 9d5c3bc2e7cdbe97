"""The job ledger in the Django admin: browse, inspect, retry, cancel, pause."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import localtime
from django.views.decorators.http import require_POST
from django_dramatiq.models import Task

from jobs.admin import bulk, job_controls, limit_views, schedule_views, waiting
from jobs.admin.dashboard import dashboard_context
from jobs.admin.job_controls import UNREACHABLE_RETRY
from jobs.admin.pagination import CheapCountPaginator
from jobs.admin.safety import SafeModelAdmin
from jobs.admin.unreachable import answers_without_redis
from jobs.admin.workers import workers_page
from jobs.broker import queues, redis_broker
from jobs.cli.failed import permanent_paths
from jobs.http.nul import has_nul
from jobs.ledger import argument_search, audit, intake, operations, states
from jobs.ledger.references import (
    Reference,
    actor_named,
    is_argument_subject,
    jobs_naming,
    references,
    subject_key,
)
from jobs.models import DailyReport, EffectRecord, Job, JobCheckpoint

# django-dramatiq's own Task table is not written here (its AdminMiddleware has
# the state races of upstream issues 105 and 154); its empty admin is hidden
# (hide_stock_task_admin, from the app's ready(): with "jobs" listed before
# "django_dramatiq", this module is imported before that admin registers).


def hide_stock_task_admin() -> None:
    if admin.site.is_registered(Task):
        admin.site.unregister(Task)


STATE_COLOURS = {
    "enqueued": "#2563eb",
    "delayed": "#7c3aed",
    "running": "#d97706",
    "succeeded": "#15803d",
    "failed": "#b91c1c",
    "skipped": "#6b7280",
    "cancelled": "#be185d",
}


def state_badge(state: str) -> SafeString:
    colour = STATE_COLOURS.get(state, "#374151")
    return format_html(
        '<span class="job-state" style="color:#fff;background:{};padding:1px 6px;'
        'border-radius:3px;font-weight:600">{}</span>',
        colour,
        state,
    )


def pretty_json(value: Any) -> SafeString:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre style="margin:0;white-space:pre-wrap">{}</pre>', text)


class ActorFilter(admin.SimpleListFilter):
    """Choices from the registered actors, not a DISTINCT over millions of rows."""

    title = "actor"
    parameter_name = "actor"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(redis_broker().actors)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        return queryset.filter(actor_name=value) if value else queryset


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in queues.queue_names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        return queryset.filter(queue_name=value) if value else queryset


class SubjectFilter(admin.SimpleListFilter):
    """One object's jobs (``?subject=auth.user:7``), through JobReference.

    Shown only while set: the choices would be every object ever named.
    """

    title = "object"
    parameter_name = "subject"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, value)] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        return jobs_naming(queryset, value) if value else queryset


SUBJECT = re.compile(r"[a-z_][\w]*\.[a-z_][\w]*:\S+", re.IGNORECASE)
MESSAGE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
# A substring search reads every row it covers; bounded, it stays well under a
# second on a 1,000,000-row ledger (see bench "admin-search").
ARGUMENT_SEARCH_ROWS = 100_000


@admin.register(Job)
class JobAdmin(SafeModelAdmin):
    list_display = (
        "short_id",
        "state_coloured",
        "actor_name",
        "queue_name",
        "attempts_display",
        "enqueued_display",
        "duration_display",
        "progress_display",
    )
    list_display_links = ("short_id",)
    list_filter = (
        "state",
        ActorFilter,
        QueueFilter,
        SubjectFilter,
        ("enqueued_at", admin.DateFieldListFilter),
    )
    search_fields = ("=message_id", "actor_name", "args", "kwargs")
    search_help_text = (
        "A message id, an object such as auth.user:7, an argument such as user_id=7 or "
        "order.number=A-12, or text in the actor name and arguments of the newest "
        f"{ARGUMENT_SEARCH_ROWS:,} jobs."
    )
    ordering = ("-id",)
    paginator = CheapCountPaginator
    show_full_result_count = False
    list_per_page = 50
    date_hierarchy = None
    actions = ("retry_selected", "cancel_selected", "delete_selected_in_batches")
    readonly_fields = (
        "message_id",
        "state_coloured",
        "actor_name",
        "queue_name",
        "attempts_display",
        "enqueued_at",
        "started_at",
        "finished_at",
        "duration_display",
        "next_retry_at",
        "worker_host",
        "worker_pid",
        "arguments_pretty",
        "refers_to",
        "options_pretty",
        "checkpoints_pretty",
        "retry_links",
        "audit_trail",
        "error_type",
        "error_message",
        "failures",
        "skip_reason",
        "progress_display",
        "cancellation",
    )
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "message_id",
                    "state_coloured",
                    "actor_name",
                    "queue_name",
                    "progress_display",
                    "cancellation",
                )
            },
        ),
        (
            "Timing",
            {
                "fields": (
                    "attempts_display",
                    "enqueued_at",
                    "started_at",
                    "finished_at",
                    "duration_display",
                    "next_retry_at",
                    "worker_host",
                    "worker_pid",
                )
            },
        ),
        (
            "Payload",
            {
                "fields": (
                    "arguments_pretty",
                    "refers_to",
                    "options_pretty",
                    "checkpoints_pretty",
                    "retry_links",
                )
            },
        ),
        ("Failure", {"fields": ("error_type", "error_message", "failures", "skip_reason")}),
        ("Operators", {"fields": ("audit_trail",)}),
    )

    # --- views ---------------------------------------------------------------

    # First sends reach the ledger through its Redis intake, which the workers
    # drain every JOBS_LEDGER_FLUSH_MS: a page that lists jobs drains it first,
    # so a job sent a moment ago is shown (and can be cancelled) even while no
    # worker runs. Bounded: under a constant stream of sends the page shows
    # what was written within the second.
    INTAKE_WAIT = 1.0

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if has_nul(request):  # a filter value PostgreSQL cannot compare: 400, not 500
            return HttpResponseBadRequest("A NUL character is not allowed in a filter.")
        intake.catch_up(timeout=self.INTAKE_WAIT)
        if request.POST.get("action") == "cancel_selected":  # the list action that needs Redis
            return answers_without_redis(super().changelist_view)(request, extra_context)
        return super().changelist_view(request, extra_context)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        changelist = super().get_changelist_instance(request)
        waiting.note_waiting(changelist.result_list)
        return changelist

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        job = super().get_object(request, object_id, from_field)
        if job is not None:
            waiting.note_waiting([job])
        return job

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        intake.catch_up(timeout=self.INTAKE_WAIT)
        job = Job.objects.filter(pk=object_id).first() if object_id.isdigit() else None
        if job is not None:
            extra_context = {
                **(extra_context or {}),
                "can_cancel": (
                    job_controls.can_cancel(job) and request.user.has_perm("jobs.cancel_job")
                ),
                "can_retry": (
                    job_controls.can_retry(job) and request.user.has_perm("jobs.retry_job")
                ),
                "permanent_failure": job_controls.permanent_failure(job),
            }
        return super().change_view(request, object_id, form_url, extra_context)

    # --- columns ------------------------------------------------------------

    @admin.display(description="message id", ordering="message_id")
    def short_id(self, job: Job) -> SafeString:
        # The whole id stays in the text (search, copy); jobs/static/jobs/console.css
        # shows its first 8 characters, so the list's columns fit at 1366 px.
        mid = job.message_id
        return format_html('<span class="job-id" title="{}">{}</span>', mid, mid)

    @admin.display(description="state", ordering="state")
    def state_coloured(self, job: Job) -> SafeString:
        badge = state_badge(job.state)
        key = getattr(job, "waiting_for", "")
        if key:  # parked for a concurrency slot (jobs.admin.waiting)
            badge = format_html(
                '{} <span class="waiting-for" title="waiting for a slot of {}">'
                "waiting for {}</span>",
                badge,
                key,
                key,
            )
        if not job.retry_of_id:
            return badge
        # A retry is a row of its own: it says so and links its original.
        return format_html(
            '{} <a class="retry-of" href="{}?q={}" title="retry of {}">↻ retry</a>',
            badge,
            reverse("admin:jobs_job_changelist"),
            job.retry_of_id,
            job.retry_of_id,
        )

    @admin.display(description="attempts")
    def attempts_display(self, job: Job) -> str:
        if job_controls.permanent_failure(job):
            # "1/3" would suggest two more tries: there will be none.
            return f"{job.attempts} (failed for good: {job.error_type})"
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="enqueued", ordering="enqueued_at")
    def enqueued_display(self, job: Job) -> str:
        # With seconds: jobs a second apart are told apart (the admin's default
        # format stops at minutes). The full timestamp is on the job page.
        return localtime(job.enqueued_at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="progress")
    def progress_display(self, job: Job) -> SafeString:
        return job_controls.progress_bar(job)

    @admin.display(description="cancel")
    def cancellation(self, job: Job) -> str:
        return job_controls.cancellation(job)

    @admin.display(description="duration", ordering="duration_ms")
    def duration_display(self, job: Job) -> str:
        return "-" if job.duration_ms is None else f"{job.duration_ms} ms"

    @admin.display(description="arguments")
    def arguments_pretty(self, job: Job) -> SafeString:
        # args and kwargs as sent; Job.arguments (by name) is what the search reads
        return pretty_json({"args": job.args, "kwargs": job.kwargs})

    @admin.display(description="refers to")
    def refers_to(self, job: Job) -> SafeString:
        actor = actor_named(job.actor_name)
        found = references(actor, job.args, job.kwargs) if actor is not None else []
        if not found:  # the actor is gone; its job still names the objects
            for subject in job.references.order_by("id").values_list("subject", flat=True):
                if is_argument_subject(subject):  # search_by's, not an object
                    continue
                label, _, object_id = subject.partition(":")
                found.append(Reference("", label, object_id))
        return format_html_join(
            mark_safe("<br>"),  # a separator of ours, not text to escape
            '{}{} <a href="{}">{}</a> (<a href="{}">its jobs</a>)',
            (
                (
                    ref.argument,
                    " \u2192" if ref.argument else "",
                    self._object_url(ref),
                    ref.subject,
                    f"{reverse('admin:jobs_job_changelist')}?{urlencode({'subject': ref.subject})}",
                )
                for ref in found
            ),
        ) or format_html("{}", "-")

    def _object_url(self, ref: Reference) -> str:
        try:
            model = apps.get_model(ref.model_label)
        except (LookupError, ValueError):
            return "#"
        if not self.admin_site.is_registered(model):
            return "#"
        try:
            return reverse(
                f"admin:{model._meta.app_label}_{model._meta.model_name}_change",
                args=[ref.object_id],
            )
        except NoReverseMatch:
            return "#"

    @admin.display(description="options")
    def options_pretty(self, job: Job) -> SafeString:
        return pretty_json(job.options)

    @admin.display(description="checkpoints")
    def checkpoints_pretty(self, job: Job) -> SafeString:
        steps = JobCheckpoint.objects.filter(message_id=job.message_id).values_list(
            "step", "data", "created_at"
        )
        return pretty_json({step: {"at": at, "data": data} for step, data, at in steps})

    @admin.display(description="retries")
    def retry_links(self, job: Job) -> SafeString:
        links = []
        if job.retry_of_id:
            links.append(("retry of", job.retry_of_id))
        # retried_as is set when the retry is sent, before the ledger has its row.
        retried = {job.retried_as} if job.retried_as else set()
        retried.update(job.retries.values_list("message_id", flat=True))
        links += [("retried as", r) for r in sorted(retried)]
        return format_html_join(
            ", ",
            '{} <a href="{}">{}</a>',
            (
                (label, f"{reverse('admin:jobs_job_changelist')}?q={mid}", mid)
                for label, mid in links
            ),
        ) or format_html("{}", "-")

    @admin.display(description="every attempt's error")
    def failures(self, job: Job) -> SafeString:
        # Tracebacks quote job data: escaped by format_html, never mark_safe.
        return format_html_join(
            "\n",
            "<details><summary>Attempt {} ({} ms on {}): {}: {}</summary>"
            '<pre style="white-space:pre-wrap">{}</pre></details>',
            (
                (a.number, a.duration_ms, a.worker_host, a.error_type, a.error_message, a.traceback)
                for a in job.failures.all()
            ),
        ) or format_html('<pre style="white-space:pre-wrap">{}</pre>', job.traceback or "-")

    @admin.display(description="operator actions")
    def audit_trail(self, job: Job) -> SafeString:
        entries = list(audit.naming(job.message_id))
        if not entries:
            return format_html("{}", "none")
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                "<li>{} · {} by {} ({}) · {} job(s){}</li>",
                (
                    (
                        localtime(e.at).strftime("%Y-%m-%d %H:%M:%S"),
                        e.action,
                        e.who,
                        e.source,
                        e.count,
                        f" · {e.target}" if e.target else "",
                    )
                    for e in entries
                ),
            ),
        )

    # --- search ---------------------------------------------------------------

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if MESSAGE_ID.fullmatch(term):
            return queryset.filter(message_id=term.lower()), False
        if SUBJECT.fullmatch(term):
            label, _, object_id = term.partition(":")
            return jobs_naming(queryset, subject_key(label, object_id)), False
        if (argument := argument_search.parse(term)) is not None:
            return argument_search.matching(queryset, argument), False
        newest = Job.objects.order_by("-id").values_list("id", flat=True).first() or 0
        recent = queryset.filter(pk__gt=newest - ARGUMENT_SEARCH_ROWS)
        return super().get_search_results(request, recent, search_term)

    # --- read-mostly ----------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 asks per location (change list or form); 5.2 has no locations.
        location = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **location)
        actions.pop("delete_selected", None)  # loads every row; ours works in batches
        return actions

    # --- actions --------------------------------------------------------------

    @admin.action(description="Retry selected failed jobs", permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        if request.POST.get("select_across") == "1":  # "all N": a job of its own
            return bulk.to_confirmation(request, "retry")
        # Counted before: a retry of a job that failed for good is allowed (the
        # cause may be fixed by now) but said, not done without a word.
        paths = permanent_paths(queryset.filter(state=states.FAILED, retried_as__isnull=True))
        permanent = (
            queryset.filter(state=states.FAILED, retried_as__isnull=True)
            .filter(error_class_path__in=paths)
            .count()
            if paths
            else 0
        )
        named = audit.first_ids(queryset)
        outcome = operations.retry_jobs(queryset)
        if outcome.done:
            audit.record("retry", who=audit.who_in(request), message_ids=named, count=outcome.done)
        kept = f" ({outcome.kept} kept until Redis answers)" if outcome.kept else ""
        self.message_user(request, f"Retried {outcome.done} job(s){kept}.", messages.SUCCESS)
        if permanent and outcome.done:
            names = ", ".join(path.rpartition(".")[2] for path in paths)
            self.message_user(
                request,
                f"{permanent} of them had failed for good ({names}): unless the cause was "
                "fixed, they will fail again.",
                messages.WARNING,
            )
        if outcome.already:
            self.message_user(
                request,
                f"{outcome.already} job(s) were already retried (see 'retried as' on each): "
                "not sent again.",
                messages.WARNING,
            )
        if outcome.skipped:
            self.message_user(
                request,
                f"{outcome.skipped} job(s) could not be retried: their message left the "
                "dead-letter set and the stored arguments were redacted, or the actor is gone "
                "(or it is a bulk action: start it again from the list).",
                messages.WARNING,
            )
        if outcome.unreachable:
            text = f"{outcome.unreachable} job(s) not retried. {UNREACHABLE_RETRY}"
            self.message_user(request, text, messages.ERROR)
        return None

    @admin.action(description="Cancel selected jobs (waiting or running)", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        if request.POST.get("select_across") == "1":
            return bulk.to_confirmation(request, "cancel")
        named = audit.first_ids(queryset)
        outcome = operations.cancel_jobs(queryset, by=request.user.get_username())
        if outcome.done + outcome.requested:
            audit.record(
                "cancel",
                who=audit.who_in(request),
                message_ids=named,
                count=outcome.done + outcome.requested,
            )
        self.message_user(request, f"Cancelled {outcome.done} waiting job(s).", messages.SUCCESS)
        if outcome.requested:
            self.message_user(
                request,
                f"Asked {outcome.requested} running job(s) to stop: each stops at its next "
                "check, or by force after the grace period.",
                messages.SUCCESS,
            )
        if outcome.already:
            self.message_user(
                request,
                f"{outcome.already} running job(s) were already asked to stop.",
                messages.WARNING,
            )
        return None

    @admin.action(description="Delete selected jobs", permissions=["delete"])
    def delete_selected_in_batches(
        self, request: HttpRequest, queryset: QuerySet[Job]
    ) -> HttpResponse | None:
        if request.POST.get("select_across") == "1":
            return bulk.to_confirmation(request, "delete")
        if request.POST.get("confirmed") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": "Delete jobs?",
                "count": queryset.order_by().values("pk")[:1_000_001].count(),
                "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
                "select_across": request.POST.get("select_across", "0"),
                "query_string": request.GET.urlencode(),
                "opts": self.model._meta,
            }
            return TemplateResponse(request, "admin/jobs/job/delete_in_batches.html", context)
        named = audit.first_ids(queryset)
        outcome = operations.delete_jobs(queryset)
        if outcome.done:
            audit.record("delete", who=audit.who_in(request), message_ids=named, count=outcome.done)
        self.message_user(request, f"Deleted {outcome.done} job(s).", messages.SUCCESS)
        return None

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        # The job page's own Delete link (the list's goes through the action)
        super().delete_model(request, obj)
        audit.record("delete", who=audit.who_in(request), message_ids=[obj.message_id])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        named = audit.first_ids(queryset)
        count = queryset.count()
        super().delete_queryset(request, queryset)
        if count:
            audit.record("delete", who=audit.who_in(request), message_ids=named, count=count)

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("jobs.retry_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("jobs.cancel_job")

    # --- dashboard ------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        extra = [
            path(
                "dashboard/",
                self.admin_site.admin_view(self.dashboard_view),
                name="jobs_dashboard",
            ),
            path(
                "schedules/",
                self.admin_site.admin_view(self.schedules_view),
                name="jobs_schedules",
            ),
            path("workers/", self.admin_site.admin_view(workers_page(self)), name="jobs_workers"),
            path(
                "limits/",
                self.admin_site.admin_view(lambda r: limit_views.limits_page(self, r)),
                name="jobs_limits",
            ),
            path(
                "limits/change/",
                self.admin_site.admin_view(
                    require_POST(
                        answers_without_redis(
                            lambda r: limit_views.change_view(self, r), "admin:jobs_limits"
                        )
                    )
                ),
                name="jobs_limit_change",
            ),
            path(
                "<int:object_id>/cancel/",
                self.admin_site.admin_view(
                    require_POST(
                        answers_without_redis(
                            lambda r, object_id: job_controls.cancel_one(self, r, object_id)
                        )
                    )
                ),
                name="jobs_job_cancel",
            ),
            path(
                "bulk/<str:name>/",
                self.admin_site.admin_view(bulk.confirm_view),
                name="jobs_bulk",
            ),
            path(
                "<int:object_id>/retry/",
                self.admin_site.admin_view(
                    require_POST(lambda r, object_id: job_controls.retry_one(self, r, object_id))
                ),
                name="jobs_job_retry",
            ),
            path(
                "schedules/<str:actor_name>/run/",
                self.admin_site.admin_view(
                    require_POST(answers_without_redis(self.run_now_view, "admin:jobs_schedules"))
                ),
                name="jobs_run_now",
            ),
            path(
                "schedules/<str:actor_name>/<str:verb>/",
                self.admin_site.admin_view(require_POST(self.schedule_change_view)),
                name="jobs_schedule_change",
            ),
            path(
                "dashboard/queue/<str:queue_name>/<str:verb>/",
                self.admin_site.admin_view(
                    require_POST(
                        answers_without_redis(self.queue_control_view, "admin:jobs_dashboard")
                    )
                ),
                name="jobs_queue_control",
            ),
        ]
        return extra + super().get_urls()

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        intake.catch_up(timeout=self.INTAKE_WAIT)
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        context = {
            **self.admin_site.each_context(request),
            **dashboard_context(),
            "title": "Jobs dashboard",
            "opts": self.model._meta,
            "can_pause": request.user.has_perm("jobs.pause_queue"),
        }
        return TemplateResponse(request, "admin/jobs/dashboard.html", context)

    def schedules_view(self, request: HttpRequest) -> HttpResponse:
        return schedule_views.schedules_page(self, request)

    def run_now_view(self, request: HttpRequest, actor_name: str) -> HttpResponse:
        return schedule_views.run_now_view(self, request, actor_name)

    def schedule_change_view(
        self, request: HttpRequest, actor_name: str, verb: str
    ) -> HttpResponse:
        return schedule_views.change_view(self, request, actor_name, verb)

    def queue_control_view(self, request: HttpRequest, queue_name: str, verb: str) -> HttpResponse:
        if not request.user.has_perm("jobs.pause_queue"):
            return HttpResponse("You may not pause or resume queues.", status=403)
        if queue_name not in queues.queue_names() or verb not in ("pause", "resume"):
            return HttpResponse("Unknown queue or action.", status=404)
        if (queues.pause if verb == "pause" else queues.resume)(queue_name):
            audit.record(verb, who=audit.who_in(request), target=f"queue {queue_name}", count=0)
        self.message_user(request, f"Queue {queue_name!r}: {verb}d.", messages.SUCCESS)
        return redirect("admin:jobs_dashboard")


@admin.register(DailyReport)
class DailyReportAdmin(SafeModelAdmin):
    list_display = ("date", "sections", "failed_jobs", "created_at", "emailed_at")
    ordering = ("-date",)
    date_hierarchy = "date"
    fields = ("date", "created_at", "emailed_at", "report")
    readonly_fields = fields

    @admin.display(description="figures")
    def sections(self, report: DailyReport) -> str:
        rows = report.figures.get("sections", [])
        return ", ".join(f"{row['title']}: {row['value']}" for row in rows) or "-"

    @admin.display(description="failed jobs")
    def failed_jobs(self, report: DailyReport) -> int:
        return int(report.figures.get("jobs_failed", 0))

    @admin.display(description="report")
    def report(self, report: DailyReport) -> SafeString:
        return format_html('<pre style="white-space:pre-wrap">{}</pre>', report.text)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(EffectRecord)
class EffectRecordAdmin(SafeModelAdmin):
    list_display = ("key", "state", "created_at", "done_at", "lease_until")
    list_filter = ("state",)
    search_fields = ("=key",)
    ordering = ("-id",)
    readonly_fields = ("key", "state", "claim_token", "lease_until", "created_at", "done_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
