"""The wire form of a customer (API answers and event bodies)."""

from customers.models import Customer


def render_customer(customer: Customer) -> dict:
    return {
        "id": customer.id,
        "object": "customer",
        "email": customer.email or None,
        "name": customer.name or None,
        "phone": customer.phone or None,
        "metadata": customer.metadata,
        "created": int(customer.created_at.timestamp()),
    }


def render_deleted(customer_id: str) -> dict:
    """A deleted customer carries its id only: the event outlives the erasure, so it must
    not keep the personal data the erasure removed."""
    return {"id": customer_id, "object": "customer", "deleted": True}
