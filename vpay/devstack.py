"""``make run``: the whole stack on one machine, in the foreground.

Starts the database (embedded unless ``DATABASE_URL`` is set; live mode requires it),
applies migrations, makes sure an admin login exists (development only), then runs the
worker and the web process as child processes. In development it also runs the sandbox webhook receiver
(``sandbox.receiver``) with a development merchant whose endpoint points at it, so every
event emitted locally is delivered, signed, and verified there, and the sandbox rail
(``sandbox.rail``) that the development rails point at (``python manage.py demo_charge``
takes a payment through it). Ctrl-C (or SIGTERM) stops
them all: the worker drains first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEB_ADDR = os.environ.get("VPAY_WEB_ADDR", "127.0.0.1:8000")
DEV_ADMIN_USER = "admin"
RECEIVER_PORT = os.environ.get("VPAY_SANDBOX_RECEIVER_PORT", "8200")
DEV_MERCHANT = "Development merchant"


def _manage(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), *args]


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vpay.settings")
    if os.environ.get("VPAY_LIVE_MODE", "").lower() not in ("1", "true", "yes", "on"):
        # Development only: live mode refuses VPAY_DEBUG, and the dev receiver listens on
        # loopback, which the SSRF guard otherwise refuses.
        os.environ.setdefault("VPAY_DEBUG", "1")
        os.environ.setdefault("VPAY_WEBHOOK_ALLOW_CIDRS", "127.0.0.1/32")
    import django
    from django.core.exceptions import ImproperlyConfigured

    from vpay.embedded_db import ensure_running_if_used

    try:
        ensure_running_if_used()  # the embedded database when DATABASE_URL is unset
    except ImproperlyConfigured as exc:
        print(f"vpay: refusing to start: {exc}", file=sys.stderr)
        return 1
    django.setup()
    from django.conf import settings

    print("vpay: applying migrations", flush=True)
    subprocess.run(_manage("migrate", "--no-input"), check=True)
    if not settings.LIVE_MODE:
        _ensure_dev_admin()

    children = {
        "worker": subprocess.Popen(_manage("runworker", "--concurrency", "4", "--metrics-port", "9100")),
        "web": subprocess.Popen(_manage("runserver", WEB_ADDR, "--noreload")),
    }
    if not settings.LIVE_MODE:
        secrets = _ensure_dev_webhook_endpoint()
        args = [sys.executable, "-m", "sandbox.receiver", "--port", RECEIVER_PORT]
        for secret in secrets:
            args += ["--secret", secret]
        children["receiver"] = subprocess.Popen(args, cwd=ROOT)
        print(
            f"vpay: sandbox webhook receiver on http://127.0.0.1:{RECEIVER_PORT}/ (what arrived: /__admin/received)",
            flush=True,
        )
    if not settings.LIVE_MODE and not settings.VPAY_RAILS_FILE:
        # The development rails (sandbox_push, sandbox_redirect) point at this process.
        from urllib.parse import urlsplit

        rail_port = str(urlsplit(settings.VPAY_SANDBOX_RAIL_URL).port or 8701)
        children["rail"] = subprocess.Popen([sys.executable, "-m", "sandbox.rail", "--port", rail_port], cwd=ROOT)
        print(
            f"vpay: sandbox rail on {settings.VPAY_SANDBOX_RAIL_URL} (what arrived: /__admin/requests);"
            " take a payment through it: python manage.py demo_charge",
            flush=True,
        )
    print(
        f"vpay: web on http://{WEB_ADDR}/ (admin: /{settings.ADMIN_URL}), worker metrics on :9100; Ctrl-C stops",
        flush=True,
    )

    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while not stopping and all(p.poll() is None for p in children.values()):
        time.sleep(0.2)
    for proc in children.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for name, proc in children.items():
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            print(f"vpay: {name} did not stop; killing it", flush=True)
            proc.kill()
    failed = [n for n, p in children.items() if p.returncode not in (0, -signal.SIGTERM)]
    return 1 if failed and not stopping else 0


def _ensure_dev_admin() -> None:
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    if not user_model.objects.exists():
        password = os.environ.get("VPAY_DEV_ADMIN_PASSWORD", "admin")
        user_model.objects.create_superuser(DEV_ADMIN_USER, "admin@example.invalid", password)
        print(
            f"vpay: created development login {DEV_ADMIN_USER!r} (password from VPAY_DEV_ADMIN_PASSWORD, default 'admin')"
        )


def _ensure_dev_webhook_endpoint() -> list[str]:
    """A development merchant with an endpoint at the sandbox receiver; returns its secrets.

    The merchant's API key is printed once, when the merchant is created. The receiver is
    handed the endpoint's secrets so it can verify what the worker sends (development only:
    nothing else ever opens a sealed secret outside a delivery).
    """
    from merchants.models import Merchant
    from merchants.services import create_merchant
    from webhooks import repository, sealing
    from webhooks.models import WebhookEndpoint
    from webhooks.services.endpoints import create_endpoint

    url = f"http://127.0.0.1:{RECEIVER_PORT}/hooks"
    merchant = Merchant.objects.filter(name=DEV_MERCHANT).first()
    if merchant is None:
        merchant, key = create_merchant(DEV_MERCHANT)
        print(f"vpay: created {DEV_MERCHANT!r}; its API key (shown once): {key}", flush=True)
    endpoint = WebhookEndpoint.objects.filter(merchant=merchant, url=url, deleted_at__isnull=True).first()
    if endpoint is None:
        endpoint, _ = create_endpoint(merchant, url=url, enabled_events=["*"])
    secrets = []
    for sealed in repository.active_sealed_secrets(endpoint.pk):
        try:
            secrets.append(sealing.open_sealed(sealed, endpoint.pk))
        except sealing.SecretUnreadable:
            continue
    return secrets


if __name__ == "__main__":
    sys.exit(main())
