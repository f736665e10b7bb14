"""Django's system checks, which no other test runs: the development settings pass them all
(warnings included), and live-mode settings pass ``check --deploy`` with only the two HSTS
warnings that are the operator's call (docs/deploy.md)."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
from pathlib import Path

from cryptography.fernet import Fernet
from django.apps import apps
from django.core.management import call_command

ROOT = Path(__file__).resolve().parent.parent
# Whether every subdomain is HTTPS-only (W005), and submitting the domain to the browsers'
# preload list (W021), commit domains vpay does not own: the operator decides.
OPERATORS_CALL = {"security.W005", "security.W021"}


def test_every_model_using_a_postgres_field_or_index_has_its_app_installed():
    # Django 6 refuses to migrate without it (postgres.E005); Django 5.2 does not check.
    users = [
        f"{model._meta.label}.{thing.name}"
        for model in apps.get_models()
        for thing in [*model._meta.get_fields(), *model._meta.indexes]
        if type(thing).__module__.startswith("django.contrib.postgres")
    ]
    assert users, "no model uses django.contrib.postgres any more: this test can go"
    assert apps.is_installed("django.contrib.postgres"), users


def test_the_development_settings_pass_every_system_check_warnings_included():
    call_command("check", fail_level="WARNING")


def test_live_mode_settings_pass_check_deploy_but_for_the_operators_hsts_choices(tmp_path):
    rails = tmp_path / "rails.json"
    rails.write_text(json.dumps({"momo": {"base_url": "https://rail.example", "flow": "push", "api_key": "k" * 20}}))
    env = {
        "PATH": "/usr/bin:/bin",
        "VPAY_LIVE_MODE": "true",
        # Never connected to: `check` without --database reads no database.
        "DATABASE_URL": "postgresql://vpay:unused@db.invalid:5432/vpay",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "VPAY_SECRETS_KEY": Fernet.generate_key().decode(),
        "VPAY_ALLOWED_HOSTS": "pay.example.com",
        "VPAY_RAILS_FILE": str(rails),
        # Live mode refuses the local defaults of the URLs payers and clients are sent to.
        "VPAY_PUBLIC_URL": "https://pay.example.com",
        "VPAY_CHECKOUT_BASE_URL": "https://pay.example.com/checkout",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert set(re.findall(r"\((\w+\.[A-Z]\d+)\)", output)) == OPERATORS_CALL, output[-3000:]
