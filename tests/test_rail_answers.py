"""Rail answers the adapter cannot read are transient, whatever is wrong with them: a rail
played byte for byte by a real HTTP server (``tests.rail_support.ScriptedRail``), through
the adapter, the confirm (the API) and a poll (the worker loop, in process)."""

from __future__ import annotations

import gzip

import pytest

from charges.models import Charge, PaymentIntent
from charges.rails.adapter import HttpRailAdapter, RailUnavailable
from charges.rails.config import RailConfig
from charges.states import RailFlow, RailStatus
from jobs.adapters.postgres import enqueue
from jobs.kinds import JobKind
from jobs.models import DeadLetter
from jobs.runner.worker import Worker
from tests.charges_support import FAST_POLICY, Merchant, apply_policy, charge_of, poll_job, sql, use_rails
from tests.rail_support import API_KEY, ScriptedRail
from tests.rail_support import scripted_rail as scripted_rail  # the fixture

PENDING = b'{"status": "pending"}'
# What each answer is: (status, headers, body). None of them is a refusal, and none may
# escape the adapter as anything but RailUnavailable.
UNREADABLE = {
    # str.isdigit() is true of these, and float() refuses them.
    "retry_after_superscript": (503, {"Retry-After": "\u00b2"}, b""),
    "retry_after_arabic_indic": (429, {"Retry-After": "\u0663"}, b""),
    # Declared gzip, and not gzip: a decoder would raise (httpx.DecodingError, no transport error).
    "content_encoding_lies": (200, {"Content-Encoding": "gzip"}, b"\x00not gzip at all"),
    # Compressed although we asked for identity: bytes, not an answer.
    "compressed_unasked": (200, {"Content-Encoding": "gzip"}, gzip.compress(PENDING)),
    # Nesting deeper than the parser's recursion limit (RecursionError), within the size cap.
    "nested_too_deep": (200, {}, b"[" * 30000 + b"]" * 30000),
    # A status that is not a string (unhashable: `in` a set raises TypeError).
    "status_not_a_string": (200, {}, b'{"status": ["pending"]}'),
    # Text PostgreSQL refuses to store: the statement recording the answer would raise.
    "nul_in_body": (200, {}, b"\x00<html>"),
    "nul_in_failure_code": (200, {}, b'{"status": "failed", "failure_code": "x\\u0000"}'),
    "lone_surrogate": (200, {}, b'{"status": "pending", "pay_token": "\\ud800"}'),
}


def adapter(rail: ScriptedRail) -> HttpRailAdapter:
    return HttpRailAdapter(
        RailConfig("scripted", rail.url, RailFlow.PUSH, API_KEY), connect_timeout=0.5, total_timeout=2.0
    )


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_an_answer_the_adapter_cannot_read_is_transient_on_a_submit_and_a_status_read(scripted_rail, case):
    status, headers, body = UNREADABLE[case]
    for method in ("POST", "GET"):
        scripted_rail.answer(method, status, body, headers)
    a = adapter(scripted_rail)
    with pytest.raises(RailUnavailable) as caught:
        a.submit(reference="ch_x", amount=1000, currency="usd")
    assert caught.value.http_status == status
    with pytest.raises(RailUnavailable):
        a.status(reference="ch_x", pay_token=None)
    with pytest.raises(RailUnavailable):
        a.refund_status(reference="re_x")


def test_a_retry_after_of_unicode_digits_is_no_delay_and_ascii_digits_still_are(scripted_rail):
    scripted_rail.answer("GET", 503, headers={"Retry-After": "\u0663\u0660"})
    with pytest.raises(RailUnavailable) as caught:
        adapter(scripted_rail).status(reference="ch_x", pay_token=None)
    assert caught.value.retry_after is None
    scripted_rail.answer("GET", 503, headers={"Retry-After": "30"})
    with pytest.raises(RailUnavailable) as caught:
        adapter(scripted_rail).status(reference="ch_x", pay_token=None)
    assert caught.value.retry_after == 30.0


def test_the_adapter_asks_for_no_encoding_and_reads_the_body_as_sent(scripted_rail):
    # A wrong label on a plain answer is not decoded (nothing is): the bytes are the answer.
    scripted_rail.answer("GET", 200, PENDING, {"Content-Encoding": "gzip"})
    assert adapter(scripted_rail).status(reference="ch_x", pay_token=None).status is RailStatus.PENDING
    assert scripted_rail.seen[-1]["headers"]["Accept-Encoding"] == "identity"


# --- what the confirm and the poll make of it ---------------------------------------------


@pytest.fixture
def scripted(settings, tmp_path, scripted_rail):
    use_rails(settings, tmp_path, scripted_rail.rails())
    apply_policy(settings, FAST_POLICY)
    return scripted_rail


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "case", ["retry_after_superscript", "content_encoding_lies", "nested_too_deep", "nul_in_body", "lone_surrogate"]
)
def test_a_confirm_the_rail_answers_unreadably_leaves_the_charge_submitting_not_a_500(scripted, case):
    status, headers, body = UNREADABLE[case]
    scripted.answer("POST", status, body, headers)
    acme = Merchant("Acme")
    intent = acme.confirm(acme.intent(amount=1000, rail="scripted")["id"])  # asserts a 200
    assert intent["status"] == "processing" and intent["charge"]["status"] == "submitting"
    (code, answered, error), *_ = sql(
        "SELECT status_code, answered_at IS NOT NULL, error FROM provider_requests WHERE charge_id = %s",
        [intent["charge"]["id"]],
    )
    assert (code, answered) == (status, True) and error


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "case", ["retry_after_arabic_indic", "content_encoding_lies", "status_not_a_string", "nul_in_failure_code"]
)
def test_a_poll_the_rail_answers_unreadably_takes_its_next_rung_never_a_dead_letter(scripted, case):
    status, headers, body = UNREADABLE[case]
    scripted.answer("GET", status, body, headers)
    from merchants.services import create_merchant

    merchant = create_merchant("Poll Ltd")[0]
    intent = PaymentIntent.objects.create(
        merchant=merchant, amount=1000, currency="usd", rail="scripted", status="processing"
    )
    charge = Charge.objects.create(
        intent=intent, merchant=merchant, rail="scripted", flow="push", amount=1000, currency="usd", status="submitted"
    )
    enqueue(JobKind.POLL_CHARGE, {"charge_id": charge.id}, dedupe_key=f"charge:poll:{charge.id}")
    assert Worker().run_once() == 1
    assert DeadLetter.objects.count() == 0
    job = poll_job(charge.id)
    assert job is not None and 0 < job["due_in"] <= 0.2 and "unavailable" in job["last_error"]
    assert charge_of(intent.id)["status"] == "submitted"
