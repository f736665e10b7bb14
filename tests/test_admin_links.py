"""Links to an admin change page quote the key as the admin unquotes it. Our ids are a
prefix, ``_`` and base62 characters, and the admin reads ``_3A`` in a raw key as ``:``: an
alert's link to ``evt_3A…`` or ``ch_2F…`` (about one id in 190) opened "doesn't exist"."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import UNQUOTE_MAP, unquote
from django.contrib.auth.models import User
from django.test import Client
from django.urls import resolve

from jobs.operator.alerts import admin_change_path, admin_path
from merchants.models import Merchant


@pytest.mark.parametrize("escape", sorted(UNQUOTE_MAP))
def test_an_id_holding_any_escape_the_admin_reads_comes_back_whole(escape):
    pk = f"evt{escape}" + "x" * 21
    match = resolve(admin_change_path("webhooks_event", pk))
    assert match.url_name == "webhooks_event_change" and unquote(match.kwargs["object_id"]) == pk


@pytest.mark.django_db
def test_the_link_to_an_object_whose_id_looks_escaped_opens_its_page():
    merchant = Merchant.objects.create(id="acct_3A" + "k" * 22, name="Colon Corp")
    User.objects.create_superuser("ops", "ops@example.com", "pw-ops-123")
    client = Client()
    client.force_login(User.objects.get(username="ops"))  # the login page itself: tests/test_admin_signin.py
    for link in (admin_path(merchant), admin_change_path("merchants_merchant", merchant.pk)):
        page = client.get(link)
        assert page.status_code == 200, link  # 302 to the index: "doesn't exist"
        assert "Colon Corp" in page.content.decode()
