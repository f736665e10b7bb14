"""Read-only views of the queue's tables. Replay, discard and cancel arrive with the ops console."""

from django.contrib import admin

from jobs.models import DeadLetter, Job, ProcessedJob


class ReadOnlyAdmin(admin.ModelAdmin):
    show_full_result_count = False  # count(*) on a big queue table is not free

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ("job_id", "kind", "queue", "tenant", "run_at", "attempts", "locked_by", "last_error")
    list_filter = ("kind", "queue")
    search_fields = ("=job_id", "=correlation_id", "=dedupe_key")
    ordering = ("run_at",)


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = ("id", "state", "kind", "queue", "cause", "attempts", "created_at", "correlation_id")
    list_filter = ("state", "kind", "queue", "cause")
    search_fields = ("=job_id", "=correlation_id")
    ordering = ("-created_at",)


@admin.register(ProcessedJob)
class ProcessedJobAdmin(ReadOnlyAdmin):
    list_display = ("job_id", "kind", "subject", "processed_at", "expires_at")
    search_fields = ("=job_id",)
    ordering = ("-processed_at",)
