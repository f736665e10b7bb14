"""What every ops-console page shares: read-only model admins and the two-step action with a
reason (a reason page re-posting the selected ids, then the act), in the shape of Django's
``delete_selected``."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from jobs.admin.forms import ReasonForm, bound_on_confirm
from jobs.services import dead_letters as ops

EXCERPT = 80


class ReadOnlyAdmin(admin.ModelAdmin):
    show_full_result_count = False  # count(*) on a big queue table is not free

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _action_context(self, request, items, **extra):
        """The context every action page needs to re-post the selection (``delete_selected``'s)."""
        return {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "selected_ids": [obj.pk for obj in items],
            **extra,
        }

    def _act_with_reason(
        self,
        request,
        items,
        *,
        act: Callable[[str, dict], None],
        reason_required: str,
        template: str,
        extra_form: type | None = None,
        **extra,
    ):
        """An action that records a reason. First step: the reason page. Confirming step: a
        valid reason (and ``extra_form``, when given) runs ``act(reason, options)``, which acts and says
        what happened; an invalid one renders the page again with the error, status 400, and
        nothing is written."""
        data = bound_on_confirm(request)
        form = ReasonForm(data, required_message=reason_required)
        options = extra_form(data) if extra_form else None
        if data is not None and form.is_valid() and (options is None or options.is_valid()):
            act(form.cleaned_data["reason"], options.cleaned_data if options is not None else {})
            return None
        context = self._action_context(request, items, form=form, options_form=options, **extra)
        return TemplateResponse(request, template, context, status=400 if data is not None else 200)


def result_messages(request, results: list[ops.Result], verb: str, noun: str = "dead letter") -> None:
    """One success message naming what was done, one warning per refusal saying why."""
    done = [r for r in results if r.done]
    refused = [r for r in results if not r.done]
    if done:
        ids = ", ".join(f"#{r.id}" for r in done)
        messages.success(request, f"{verb} {len(done)} {noun}{'s' if len(done) != 1 else ''}: {ids}.")
    for r in refused:
        messages.warning(request, f"Refused: {noun} #{r.id} {r.message}.")
