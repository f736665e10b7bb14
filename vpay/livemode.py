"""``livemode`` on every wire object: API answers and event bodies.

A deployment is live or not (``VPAY_LIVE_MODE``), and so is everything it makes: every
object in an answer (a dict with an ``object`` other than ``list``, at any depth, unless
it is ``deleted``) carries
``livemode`` set from it. One function adds it, called where answers are made
(``api.framework.respond``) and where events are written (``webhooks.events.emit``), so a
new object type carries it without its renderer knowing.

An event's body stores ``livemode`` when it is written, so a delivery retried after a
setting change still signs the bytes it first sent; an event written before ``livemode``
existed keeps its original body.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings


def with_livemode(value: Any, livemode: bool | None = None) -> Any:
    """A copy of ``value`` in which every object lacking ``livemode`` carries it."""
    if livemode is None:
        livemode = settings.LIVE_MODE
    if isinstance(value, dict):
        # ``metadata`` is the merchant's own strings, never an object of ours, even when
        # one of its keys is "object".
        copied = {key: item if key == "metadata" else with_livemode(item, livemode) for key, item in value.items()}
        # Lists are envelopes, and a deleted object is its id alone (as Stripe's are).
        if isinstance(copied.get("object"), str) and copied["object"] != "list" and copied.get("deleted") is not True:
            copied.setdefault("livemode", livemode)
        return copied
    if isinstance(value, list):
        return [with_livemode(item, livemode) for item in value]
    return value
