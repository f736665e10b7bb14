"""``python manage.py demo_charge``: take one payment through a development rail, end to end.

Development only (refused in live mode): uses the development merchant ``make run``
creates (whose webhook endpoint is the sandbox receiver, so the settlement webhook arrives
there, signed), or creates it; makes an intent on the rail, confirms it as the API would,
then watches the worker settle it and prints the events it produced. Needs the worker and
the sandbox rail running (``make run`` starts both).
"""

from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from charges.models import PaymentIntent
from charges.services.confirm import confirm_intent
from charges.services.intents import create_intent
from charges.states import INTENT_TERMINAL
from merchants.models import Merchant
from merchants.services import create_merchant
from vpay.errors import DomainError
from webhooks.models import Event

# The merchant vpay.devstack creates, with the sandbox receiver as its endpoint.
DEMO_MERCHANT = "Development merchant"


class Command(BaseCommand):
    help = "Take one payment through a development rail and print what happened (development only)."

    def add_arguments(self, parser):
        parser.add_argument("--rail", default="sandbox_push", help="sandbox_push (default) or sandbox_redirect")
        parser.add_argument(
            "--amount", type=int, default=1000, help="minor units; the sandbox fails x402, 503s x503 (amount %% 1000)"
        )
        parser.add_argument("--currency", default="usd")
        parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for settlement")

    def handle(self, *args, **opts):
        if settings.LIVE_MODE:
            raise CommandError("demo_charge is for development only")
        merchant = Merchant.objects.filter(name=DEMO_MERCHANT).first() or create_merchant(DEMO_MERCHANT)[0]
        try:
            intent = create_intent(
                merchant, {"amount": opts["amount"], "currency": opts["currency"], "rail": opts["rail"]}
            )
            intent = confirm_intent(merchant, intent.id)
        except DomainError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        charge = intent.charge
        self.stdout.write(f"confirmed {intent.id}: intent {intent.status}, charge {charge.id} {charge.status}")
        if charge.redirect_url:
            self.stdout.write(f"the payer would be sent to: {charge.redirect_url}")
        deadline = time.monotonic() + opts["wait"]
        while time.monotonic() < deadline:
            intent = PaymentIntent.objects.select_related("charge").get(pk=intent.id)
            if intent.status in INTENT_TERMINAL or intent.charge.status == "unresolved":
                break
            time.sleep(0.2)
        self.stdout.write(
            f"now: intent {intent.status}, charge {intent.charge.status} {intent.charge.failure_code or ''}"
        )
        for event in Event.objects.filter(merchant=merchant, data__id=intent.id).order_by("created_at"):
            self.stdout.write(f"event {event.id} {event.type}")
        if merchant.webhook_endpoints.filter(deleted_at__isnull=True).exists():
            self.stdout.write("the webhook for it goes to the sandbox receiver: GET /__admin/received there")
        if intent.status not in INTENT_TERMINAL:
            raise CommandError("not settled yet: is the worker running (make run)?")
