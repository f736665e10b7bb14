"""The sandbox rail's authorize-then-capture routes (``POST /<rail>/charges/<ref>/capture``
and ``POST /<rail>/charges/<ref>/void``), a mixin of ``sandbox.rail.Handler``: the protocol
is in that module's docstring."""

from __future__ import annotations

import time

from sandbox.rail_state import RailCharge

# Why a capture of a charge not in the authorized state is refused, by its settled state.
_NOT_CAPTURABLE = {
    None: "charge not authorized yet",
    "failed": "charge failed",
    "canceled": "charge was voided",
}


class CaptureRoutes:
    """Needs the handler's ``server.state``, ``_authorized``, ``_refuse``, ``_send`` and ``_drop``."""

    def _capture_or_void(self, path: str, rail: str, reference: str, kind: str, body: dict | None) -> None:
        state = self.server.state
        entry = {
            "method": "POST",
            "path": path,
            "kind": kind,
            "rail": rail,
            "reference": reference,
            "idempotency_key": self.headers.get("Idempotency-Key"),
            "body": body,
            "answered": True,
        }
        if not self._authorized():
            with state.lock:
                charge = state.charges.get((rail, reference))
            return self._refuse(entry, reference, charge.amount if charge else None)
        scenario, errored, dropped = {}, False, False
        with state.lock:
            charge = state.charges.get((rail, reference))
            if charge is None:
                code, answer = 404, {"error": "not found"}
            else:
                scenario = state.scenario(reference, charge.amount)
                if kind == "capture":
                    charge.captures += 1
                    n = charge.captures
                else:
                    charge.voids += 1
                    n = charge.voids
                errors = scenario.get(f"{kind}_error", 0)
                refusals = errors + (scenario.get("capture_refuse", 0) if kind == "capture" else 0)
                errored = n <= errors
                dropped = refusals < n <= refusals + scenario.get(f"{kind}_drop", 0)
                if errored:
                    code, answer = scenario.get("error_status", 503), {"error": "unavailable"}
                elif n <= refusals:
                    code, answer = 400, {"error": "capture refused"}  # nothing captured
                elif kind == "capture":
                    code, answer = self._capture(charge, body, scenario)
                else:
                    code, answer = 200, self._void(charge, scenario)
            state.record(
                {
                    **entry,
                    "status": None if dropped else code,
                    "answered": not dropped,
                    "rail_status": answer.get("status"),
                }
            )
        delay = scenario.get(f"{kind}_delay", 0)
        if delay:
            time.sleep(delay)
        if dropped:
            return self._drop()
        return self._send(code, answer, retry_after=scenario.get("retry_after") if errored else None)

    def _capture(self, charge: RailCharge, body: dict | None, scenario: dict) -> tuple[int, dict]:
        """Capture ``body["amount"]`` of an authorization (caller holds the lock)."""
        amount = body.get("amount") if body else None
        if type(amount) is not int or amount <= 0:
            return 400, {"error": "amount must be a positive integer"}
        if charge.amount_captured is None:
            if charge.capture:
                return 400, {"error": "charge is not an authorization (submitted with capture true)"}
            if charge.settled != "authorized":
                return 400, {"error": _NOT_CAPTURABLE.get(charge.settled, "charge not authorized")}
            if amount > charge.amount:
                return 400, {"error": "amount exceeds the authorized amount"}
            charge.amount_captured, charge.settled = amount, "succeeded"
        return 200, self._settled_body(charge, scenario)

    def _void(self, charge: RailCharge, scenario: dict) -> dict:
        """Release a charge not settled yet (caller holds the lock); answer it as it stands."""
        if charge.settled in (None, "authorized"):
            charge.settled = "canceled"
        return self._settled_body(charge, scenario)

    def _settled_body(self, charge: RailCharge, scenario: dict) -> dict:
        body = {"reference": charge.reference, "status": charge.settled}
        if charge.settled == "succeeded":
            body["amount_captured"] = charge.amount if charge.amount_captured is None else charge.amount_captured
        elif charge.settled == "failed":
            body["failure_code"] = scenario.get("failure_code", "declined")
        return body
