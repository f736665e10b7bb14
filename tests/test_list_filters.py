"""List filters on every ``/v1`` list: the ``created`` window at its edges, ``ending_before``
beside ``starting_after`` (a round trip), ``types[]`` on events, the 400s naming the
parameter, and the plans that serve them. Django's test client, real database."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from tests.api_support import MerchantClient, error_of
from webhooks.event_types import EventType
from webhooks.events import emit

pytestmark = pytest.mark.django_db

T = 1_796_025_600  # a whole second: the bound the edges are tested at
PAYMENT = {"amount": 500, "currency": "usd", "rail": "sandbox_push"}


def ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["data"]]


def customers(api: MerchantClient, offsets: list[float]) -> list[str]:
    """Customers created at T + each offset (seconds), in that order."""
    made = []
    for offset in offsets:
        customer_id = api.call("POST", "/v1/customers", {"name": str(offset)}).json()["id"]
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE customers SET created_at = to_timestamp(%s) WHERE id = %s", [T + offset, customer_id]
            )
        made.append(customer_id)
    return made


def test_the_created_window_includes_objects_rendered_exactly_at_either_bound(acme):
    before, at_start, mid_second, at_end, after = customers(acme, [-0.000001, 0, 0.5, 0.999999, 1])
    listed = acme.call("GET", f"/v1/customers?created[gte]={T}&created[lte]={T}&limit=100")
    # Each of the three renders created == T; the neighbours render T-1 and T+1.
    assert ids(listed) == [at_end, mid_second, at_start]
    assert {row["created"] for row in listed.json()["data"]} == {T}
    assert ids(acme.call("GET", f"/v1/customers?created[gte]={T + 1}")) == [after]
    assert ids(acme.call("GET", f"/v1/customers?created[lte]={T - 1}")) == [before]
    assert ids(acme.call("GET", f"/v1/customers?created[gte]={T + 1}&created[lte]={T}")) == []


def test_the_created_window_applies_with_a_cursor_found_outside_it(acme):
    old, mid, new = customers(acme, [-10, 0, 10])
    # The cursor (new) lies outside the window; it still says where the page starts.
    assert ids(acme.call("GET", f"/v1/customers?created[lte]={T}&starting_after={new}")) == [mid, old]
    assert ids(acme.call("GET", f"/v1/customers?created[gte]={T}&ending_before={old}")) == [new, mid]


def test_ending_before_gives_back_the_page_starting_after_came_from(acme):
    made = customers(acme, [0, 1, 2, 3, 4, 5, 6])  # oldest first
    newest_first = made[::-1]
    pages, after = [], None
    while True:
        page = acme.call("GET", "/v1/customers?limit=3" + (f"&starting_after={after}" if after else "")).json()
        pages.append([row["id"] for row in page["data"]])
        if not page["has_more"]:
            break
        after = page["data"][-1]["id"]
    assert pages == [newest_first[0:3], newest_first[3:6], newest_first[6:7]]
    # And back: each page's first object is the cursor of the page before it, in the same order.
    back, before = [], pages[-1][0]
    while True:
        page = acme.call("GET", f"/v1/customers?limit=3&ending_before={before}").json()
        back.insert(0, [row["id"] for row in page["data"]])
        if not page["has_more"]:  # nothing newer
            break
        before = page["data"][0]["id"]
    assert back == pages[:-1]
    # A short page at the newest end: ending_before the second newest is the newest alone.
    newest = acme.call("GET", f"/v1/customers?limit=3&ending_before={newest_first[1]}").json()
    assert [row["id"] for row in newest["data"]] == newest_first[:1] and newest["has_more"] is False


def test_ending_before_orders_ties_on_created_by_id_like_starting_after(acme):
    made = customers(acme, [0, 0, 0, 0])  # one instant: the id breaks the tie
    newest_first = sorted(made, reverse=True)
    assert ids(acme.call("GET", "/v1/customers?limit=10")) == newest_first
    assert ids(acme.call("GET", f"/v1/customers?limit=2&ending_before={newest_first[3]}")) == newest_first[1:3]
    assert ids(acme.call("GET", f"/v1/customers?limit=2&starting_after={newest_first[0]}")) == newest_first[1:3]


def test_types_filters_events_by_several_types(acme):
    with transaction.atomic():
        succeeded = emit(acme.merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_1", "object": "payment_intent"})
        deleted = emit(acme.merchant, EventType.CUSTOMER_DELETED, {"id": "cus_1", "object": "customer"})
        emit(acme.merchant, EventType.REFUND_FAILED, {"id": "re_1", "object": "refund"})
    query = "types[]=customer.deleted&types[]=payment_intent.succeeded"
    assert sorted(ids(acme.call("GET", f"/v1/events?{query}"))) == sorted([succeeded.pk, deleted.pk])
    assert ids(acme.call("GET", "/v1/events?types[]=customer.deleted")) == [deleted.pk]
    assert ids(acme.call("GET", "/v1/events?type=customer.deleted")) == [deleted.pk]


LIST_PATHS = [
    "/v1/customers",
    "/v1/payment_intents",
    "/v1/refunds",
    "/v1/events",
    "/v1/webhook_endpoints",
]


@pytest.mark.parametrize(
    ("query", "code", "param"),
    [
        ("created[gte]=yesterday", "parameter_invalid_type", "created[gte]"),
        ("created[lte]=1.5", "parameter_invalid_type", "created[lte]"),
        ("created[gte]=-1", "parameter_out_of_range", "created[gte]"),
        ("created[lte]=99999999999999", "parameter_out_of_range", "created[lte]"),
        ("created[gte]=1&created[gte]=2", "parameter_invalid", "created[gte]"),
        ("created=1", "parameter_unknown", "created"),
        ("starting_after=x&ending_before=y", "parameter_invalid", "ending_before"),
        ("ending_before=", "parameter_invalid", "ending_before"),
        ("limit=%2B5", "parameter_invalid_type", "limit"),
    ],
)
@pytest.mark.parametrize("path", LIST_PATHS)
def test_bad_list_parameters_are_a_400_naming_the_parameter(acme, path, query, code, param):
    response = acme.call("GET", f"{path}?{query}")
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert (error["code"], error["param"]) == (code, param)


@pytest.mark.parametrize(
    ("query", "code", "param"),
    [
        ("types[]=payment_intent.succeeded&types[]=nope", "parameter_invalid", "types[]"),
        ("types=customer.deleted", "parameter_unknown", "types"),
        ("type=customer.deleted&types[]=customer.deleted", "parameter_invalid", "types[]"),
        ("type=nope", "parameter_invalid", "type"),
    ],
)
def test_bad_event_type_filters_are_a_400_naming_the_parameter(acme, query, code, param):
    response = acme.call("GET", f"/v1/events?{query}")
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert (error["code"], error["param"]) == (code, param)
    assert "nope" in error["message"] or code != "parameter_invalid" or "not both" in error["message"]


@pytest.mark.parametrize("path", LIST_PATHS)
def test_every_list_takes_the_window_and_both_cursors(acme, path):
    acme.call("POST", "/v1/customers", {"name": "x"})
    acme.call("POST", "/v1/payment_intents", PAYMENT)
    acme.call("POST", "/v1/webhook_endpoints", {"url": "https://hooks.example.com/x", "enabled_events": ["*"]})
    for query in (f"created[gte]={T * 2}", "created[lte]=0"):
        assert ids(acme.call("GET", f"{path}?{query}")) == []
    response = acme.call("GET", f"{path}?ending_before=nothing_123")
    assert response.status_code == 404 and error_of(response)["code"] == "resource_missing"


# --- the plans --------------------------------------------------------------------------------


def _plan_of_list(api: MerchantClient, path: str, table: str) -> str:
    """The plan of the SELECT a list call ran on ``table`` (its LIMIT included), sequential
    scans and sorts off: on a near-empty table the planner would otherwise scan it whole, or,
    depending on what earlier tests left in its statistics, read another index and sort. With
    both off it still sorts when no index serves the order, which is what the tests assert."""
    with CaptureQueriesContext(connection) as captured:
        response = api.call("GET", path)
    assert response.status_code == 200, response.content
    # The page's read: limit + 1 rows (the cursor's own lookup is by primary key).
    [sql] = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].startswith(f'SELECT "{table}"') and "LIMIT 11" in q["sql"]
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.parametrize(
    ("path", "table", "index"),
    [
        (
            "/v1/events?types[]=customer.deleted&types[]=refund.failed&created[gte]={T}",
            "events",
            "events_merchant_recent",
        ),
        ("/v1/events?ending_before={event}&created[lte]={T2}", "events", "events_merchant_recent"),
        ("/v1/payment_intents?created[gte]={T}&created[lte]={T2}", "payment_intents", "intents_merchant_recent"),
        ("/v1/payment_intents?ending_before={intent}", "payment_intents", "intents_merchant_recent"),
        (
            "/v1/payment_intents?status=requires_confirmation&starting_after={intent}",
            "payment_intents",
            "intents_merchant_recent",
        ),
    ],
)
def test_the_filtered_lists_read_the_merchants_newest_first_index_without_a_sort(acme, path, table, index):
    intent = acme.call("POST", "/v1/payment_intents", PAYMENT).json()["id"]
    with transaction.atomic():
        event = emit(acme.merchant, EventType.CUSTOMER_DELETED, {"id": "cus_1", "object": "customer"}).pk
    plan = _plan_of_list(acme, path.format(T=T, T2=T * 2, event=quote(event), intent=intent), table)
    assert index in plan and "Sort" not in plan, plan
    if "_before=" in path or "_after=" in path:
        # The scan starts at the cursor: its instant bounds the index condition, not a filter.
        [condition] = [line for line in plan.splitlines() if "Index Cond" in line and "merchant_id" in line]
        assert ("created_at >=" if "_before=" in path else "created_at <=") in condition, plan
