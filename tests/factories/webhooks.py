"""Webhook endpoints, events and deliveries (``tests/factories/__init__.py`` says how every
factory is made).

* ``EndpointFactory(merchant=m)``: a live endpoint subscribed to every type, made by
  ``create_endpoint``; its signing secret on ``.secret`` (shown once, as the service returns it).
* ``EventFactory(merchant=m)``: a ``payment_intent.succeeded`` event, written by ``emit``.
* ``DeliveryFactory(endpoint=e)``: a pending delivery of a new event of the endpoint's
  merchant to ``e``, made by the fan-out, deliver job and all.
"""

from __future__ import annotations

import factory
from django.db import transaction

from tests.factories.merchants import MerchantFactory
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import Event, WebhookDelivery, WebhookEndpoint
from webhooks.services.endpoints import create_endpoint
from webhooks.services.fanout import fan_out_event


class EndpointFactory(factory.Factory):
    class Meta:
        model = WebhookEndpoint

    merchant = factory.SubFactory(MerchantFactory)
    url = factory.Sequence(lambda n: f"https://hooks.example.com/{n}")
    enabled_events = factory.LazyFunction(lambda: ["*"])
    description = ""

    @classmethod
    def _create(cls, model_class, merchant, **fields) -> WebhookEndpoint:
        endpoint, secret = create_endpoint(merchant, **fields)
        endpoint.secret = secret
        return endpoint


class EventFactory(factory.Factory):
    class Meta:
        model = Event

    merchant = factory.SubFactory(MerchantFactory)
    type = EventType.PAYMENT_INTENT_SUCCEEDED
    # The rendered wire object the event is about (``emit`` adds its ``livemode``).
    data = factory.Sequence(lambda n: {"id": f"pi_{n}", "object": "payment_intent"})

    @classmethod
    def _create(cls, model_class, merchant, type, data) -> Event:
        # emit() runs only inside the transaction of the change it reports: here the
        # change is imagined, so the transaction is the factory's own.
        with transaction.atomic():
            return emit(merchant, type, data)


class DeliveryFactory(factory.Factory):
    """The event is fanned out as the drain would: every endpoint of its merchant that
    subscribes to it gets a delivery, and this factory returns ``endpoint``'s."""

    class Meta:
        model = WebhookDelivery

    endpoint = factory.SubFactory(EndpointFactory)
    event = factory.SubFactory(EventFactory, merchant=factory.SelfAttribute("..endpoint.merchant"))

    @classmethod
    def _create(cls, model_class, endpoint, event) -> WebhookDelivery:
        fan_out_event(event.pk)
        delivery = model_class.objects.filter(event=event, endpoint=endpoint).first()
        if delivery is None:
            raise ValueError(f"the fan-out made no delivery of {event.pk} to {endpoint.pk} (unsubscribed, or not live)")
        return delivery
