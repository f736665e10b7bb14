"""The merchant and customer pages of the ops console show no key and allow no edits."""

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.test import Client

from customers.models import Customer
from merchants.services import create_merchant

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client():
    User.objects.create_superuser("ops", "ops@example.com", "pw-ops-123")
    client = Client()
    client.force_login(User.objects.get(username="ops"))  # the login page itself: tests/test_admin_signin.py
    return client


def test_the_merchant_page_shows_the_key_by_its_last_four_only(admin_client):
    merchant, key = create_merchant("Acme")
    page = admin_client.get(f"/admin/merchants/merchant/{quote(merchant.id)}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert key not in body and key[-4:] in body
    assert admin_client.get("/admin/merchants/merchant/add/").status_code == 403


def test_customers_are_listed_read_only(admin_client):
    merchant, _ = create_merchant("Acme")
    customer = Customer.objects.create(merchant=merchant, email="x@example.com")
    listing = admin_client.get("/admin/customers/customer/")
    assert listing.status_code == 200 and customer.id in listing.content.decode()
    assert (
        admin_client.post(f"/admin/customers/customer/{quote(customer.id)}/delete/", {"post": "yes"}).status_code == 403
    )
    assert Customer.objects.filter(id=customer.id).exists()
