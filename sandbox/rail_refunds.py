"""The sandbox rail's refund routes (``POST /<rail>/refunds``, ``GET /<rail>/refunds/<ref>``),
a mixin of ``sandbox.rail.Handler``: the protocol is in that module's docstring."""

from __future__ import annotations

import time

from sandbox.rail_state import RailRefund, poll_answer


class RefundRoutes:
    """Needs the handler's ``server.state``, ``_authorized``, ``_refuse`` and ``_send``."""

    def _refund_refusal(self, rail: str, body: dict) -> tuple[int, str] | None:
        """Why the rail refuses a new refund for good (caller holds the lock), or None. A
        reference it already holds is the same refund: never refused, never counted twice."""
        state = self.server.state
        if (rail, body["reference"]) in state.refunds:
            return None
        charge = state.charges.get((rail, body["charge_reference"]))
        if charge is None:
            return 404, "no such charge"
        limit = charge.amount
        if not charge.capture or charge.settled == "canceled":  # an authorization, or a voided charge
            if charge.settled != "succeeded":
                return 400, "charge not captured"
            limit = charge.amount_captured
        held = sum(
            r.amount
            for r in state.refunds.values()
            if (r.rail, r.charge_reference) == (rail, charge.reference) and not r.failed
        )
        if held + body["amount"] > limit:
            return 400, "refunds would exceed the charge"
        return None

    def _refund_poll(self, path: str, rail: str, reference: str) -> None:
        state = self.server.state
        entry = {
            "method": "GET",
            "path": path,
            "kind": "refund",
            "rail": rail,
            "reference": reference,
            "answered": True,
        }
        if not self._authorized():
            return self._refuse(entry, reference, None)
        with state.lock:
            held = state.refunds.get((rail, reference))
            scenario = state.scenario(reference, held.amount if held else None)
            if held is None:
                state.record({**entry, "status": 404})
                code, status = 404, None
            else:
                code, status = poll_answer(held, scenario)
                held.failed = held.failed or status == "failed"
                state.record({**entry, "status": code, "rail_status": status, "poll": held.polls})
        delay = scenario.get("poll_delay", 0)
        if delay:
            time.sleep(delay)
        if code == 404:
            return self._send(404, {"error": "not found"})
        if code != 200:
            return self._send(code, {"error": "unavailable"}, retry_after=scenario.get("retry_after"))
        return self._send(200, self._refund_body(held, status, scenario))

    def _refund_body(self, held: RailRefund, status: str, scenario: dict) -> dict:
        body = {"reference": held.reference, "status": status}
        if status == "failed":
            body["failure_code"] = scenario.get("failure_code", "declined")
        return body
