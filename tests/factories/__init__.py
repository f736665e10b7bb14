"""factory-boy factories for the objects tests build, one module per area, each made through
the services that write it in production (a test's data is what the code would have written,
constraints and all):

* ``tests.factories.merchants``: merchants with their secret key;
* ``tests.factories.payments``: payment intents, charges, refunds;
* ``tests.factories.webhooks``: endpoints, events, deliveries;
* ``tests.factories.jobs``: jobs and dead letters.
"""

from tests.factories.jobs import DeadLetterFactory, JobFactory
from tests.factories.merchants import MerchantFactory
from tests.factories.payments import ChargeFactory, IntentFactory, RefundFactory
from tests.factories.webhooks import DeliveryFactory, EndpointFactory, EventFactory

__all__ = [
    "ChargeFactory",
    "DeadLetterFactory",
    "DeliveryFactory",
    "EndpointFactory",
    "EventFactory",
    "IntentFactory",
    "JobFactory",
    "MerchantFactory",
    "RefundFactory",
]
