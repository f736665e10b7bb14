"""``/v1/customers``."""

from django.http import HttpRequest, HttpResponse

from api.framework import METADATA, Body, Field, owned, respond, route
from api.lists import paginate
from api.operations import Operation
from api.params import LIST, takes_query
from api.schemas import list_of, ref
from customers import services
from customers.models import Customer
from customers.wire import render_customer, render_deleted


def _email(value: str) -> str:
    if value and ("@" not in value or any(c.isspace() for c in value)):
        raise ValueError("is not an email address.")
    return value


FIELDS = {
    "email": Field(
        str,
        max_length=254,
        check=_email,
        description="Empty, or an address with an @ and no whitespace.",
        schema={"pattern": r"^(|\S*@\S*)$"},
    ),
    "name": Field(str, max_length=256),
    "phone": Field(str, max_length=32),
    "metadata": METADATA,
}
WRITE = Body(**FIELDS)


def _owned(request: HttpRequest, customer_id: str) -> Customer:
    return owned(request, Customer.objects, customer_id, "customer")


@route(
    Operation("GET", "List customers, newest first.", query=LIST, answers=list_of("customer")),
    Operation("POST", "Create a customer.", body=WRITE, answers=ref("customer")),
)
@takes_query(LIST)
def customers(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        customer = services.create_customer(request.merchant, WRITE.parse(request))
        customer.refresh_from_db(fields=["created_at", "last_used_at"])
        return respond(render_customer(customer))
    return paginate(request, Customer.objects.filter(merchant=request.merchant), render_customer, request.query)


@route(
    Operation("GET", "Retrieve a customer.", answers=ref("customer")),
    Operation("POST", "Update a customer: the fields given are set.", body=WRITE, answers=ref("customer")),
    Operation(
        "DELETE",
        "Delete a customer for good (emits customer.deleted with its id only).",
        answers=ref("deleted_customer"),
    ),
)
def customer(request: HttpRequest, customer_id: str) -> HttpResponse:
    found = _owned(request, customer_id)
    if request.method == "POST":
        return respond(render_customer(services.update_customer(found, WRITE.parse(request))))
    if request.method == "DELETE":
        services.delete_customer(found)
        return respond(render_deleted(customer_id))
    return respond(render_customer(found))
