"""Submitting a bulk operation from the admin, in two steps (the operation's own page drives it).

The confirmation step is a GET carrying the filter: it says how many items match now, on
the database clock (``jobs.services.bulk.bulk_operation_preview``), and asks for a reason;
re-counting writes nothing. The POST re-sends the same filter with the reason and submits
one operation (``bulk_operation_submit``: two rows, whatever it matches); the operator
lands on the operation's page, which follows its progress. A POST that fails validation
(no reason, a bad or empty window) renders the page again with the error, status 400, and
writes nothing.

A filter form gives ``bulk_filter()`` (the filter as stored), ``bulk_options()`` and
``hidden_pairs()`` (the filter re-posted by the confirming form, exactly as counted).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from jobs.admin.forms import ReasonForm
from jobs.services import bulk


def submit_view(
    model_admin,
    request,
    *,
    operation: str,
    make_filters,
    filter_fields: tuple[str, ...],
    template: str,
    title: str,
    noun: str,
    reason_required: str,
):
    posted = request.method == "POST"
    asked = any(name in request.GET for name in filter_fields)
    filters = make_filters(request.POST if posted else (request.GET if asked else None))
    reason = ReasonForm(request.POST if posted else None, required_message=reason_required)
    preview = None
    if filters.is_bound and filters.is_valid():
        try:
            preview = bulk.bulk_operation_preview(operation=operation, filter=filters.bulk_filter())
        except bulk.BulkRefused as exc:
            filters.add_error(None, str(exc))
    if posted and preview is not None and reason.is_valid():
        operation_id = bulk.bulk_operation_submit(
            operation=operation,
            filter=filters.bulk_filter(),
            options=filters.bulk_options(),
            actor=request.user.get_username(),
            user_id=request.user.pk,
            reason=reason.cleaned_data["reason"],
        )
        messages.success(
            request,
            f"Submitted bulk operation #{operation_id}: {noun} ({preview.matched} matched when you confirmed; "
            "the workers expand it).",
        )
        return HttpResponseRedirect(_landing_url(request, operation_id, model_admin))
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": title,
        "filters": filters,
        "form": reason,
        "preview": preview,
        "hidden": filters.hidden_pairs() if preview is not None else [],
    }
    return TemplateResponse(request, template, context, status=400 if posted else 200)


def _landing_url(request, operation_id: int, model_admin) -> str:
    """The operation's own page (its progress); the list the operator came from for someone
    who may not view bulk operations."""
    if request.user.has_perm("jobs.view_bulkoperation"):
        return reverse("admin:jobs_bulkoperation_change", args=[operation_id])
    opts = model_admin.model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
