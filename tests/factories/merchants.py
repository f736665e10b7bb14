"""Merchants (``tests/factories/__init__.py`` says how every factory is made).

``MerchantFactory()`` is a saved merchant with its secret key on ``.key`` (the key is
shown once, as ``merchant_create`` returns it); ``MerchantFactory(name="Acme")`` names it.
"""

from __future__ import annotations

import factory

from merchants.models import Merchant
from merchants.services import merchant_create


class MerchantFactory(factory.Factory):
    class Meta:
        model = Merchant

    name = factory.Sequence(lambda n: f"Merchant {n}")

    @classmethod
    def _create(cls, model_class, name: str) -> Merchant:
        merchant, key = merchant_create(name=name)
        merchant.key = key
        return merchant
