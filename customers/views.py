"""``/v1/customers``."""

from django.http import HttpRequest, HttpResponse

from api.framework import METADATA, Body, Field, owned, paginate, respond, route
from api.params import LIST, takes_query
from customers import services
from customers.models import Customer
from customers.wire import render_customer, render_deleted


def _email(value: str) -> str:
    if value and ("@" not in value or any(c.isspace() for c in value)):
        raise ValueError("is not an email address.")
    return value


FIELDS = {
    "email": Field(str, max_length=254, check=_email),
    "name": Field(str, max_length=256),
    "phone": Field(str, max_length=32),
    "metadata": METADATA,
}
WRITE = Body(**FIELDS)


def _owned(request: HttpRequest, customer_id: str) -> Customer:
    return owned(request, Customer.objects, customer_id, "customer")


@route("GET", "POST")
@takes_query(LIST)
def customers(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        customer = services.create_customer(request.merchant, WRITE.parse(request))
        customer.refresh_from_db(fields=["created_at", "last_used_at"])
        return respond(render_customer(customer))
    return paginate(request, Customer.objects.filter(merchant=request.merchant), render_customer, request.query)


@route("GET", "POST", "DELETE")
def customer(request: HttpRequest, customer_id: str) -> HttpResponse:
    found = _owned(request, customer_id)
    if request.method == "POST":
        return respond(render_customer(services.update_customer(found, WRITE.parse(request))))
    if request.method == "DELETE":
        services.delete_customer(found)
        return respond(render_deleted(customer_id))
    return respond(render_customer(found))
