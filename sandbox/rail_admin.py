"""The sandbox rail's inspection and control routes (``/__admin/…``), a mixin of
``sandbox.rail.Handler``: what tests and demos read and set (the rail module's docstring)."""

from __future__ import annotations

from sandbox.rail_state import SCENARIO_FIELDS


class AdminRoutes:
    """Needs the handler's ``server.state`` and ``_send``."""

    def _admin_get(self, seg: list[str], query: dict) -> None:
        state = self.server.state
        with state.lock:
            if seg[1:] == ["requests"]:
                ref = query.get("reference")
                rows = [e for e in state.log if ref is None or e.get("reference") == ref]
                return self._send(200, {"requests": rows})
            if seg[1:] == ["refunds"]:
                charge_reference = query.get("charge_reference")
                held = [
                    {
                        "reference": r.reference,
                        "rail": r.rail,
                        "charge_reference": r.charge_reference,
                        "amount": r.amount,
                        "currency": r.currency,
                        "polls": r.polls,
                        "submits": state.submits.get((r.rail, r.reference), 0),
                    }
                    for r in state.refunds.values()
                    if charge_reference is None or r.charge_reference == charge_reference
                ]
                return self._send(200, {"refunds": held})
            if len(seg) == 3 and seg[1] == "charges":
                found = [c for (_, ref), c in state.charges.items() if ref == seg[2]]
                if not found:
                    return self._send(404, {"error": "not found"})
                c = found[0]
                return self._send(
                    200,
                    {
                        "reference": c.reference,
                        "rail": c.rail,
                        "amount": c.amount,
                        "currency": c.currency,
                        "polls": c.polls,
                        "submits": state.submits.get((c.rail, c.reference), 0),
                        "capture": c.capture,
                        "settled": c.settled,
                        "amount_captured": c.amount_captured,
                        "captures": c.captures,
                        "voids": c.voids,
                    },
                )
        return self._send(404, {"error": "no such route"})

    def _admin_post(self, seg: list[str], body: dict | None) -> None:
        state = self.server.state
        if seg[1:] == ["reset"]:
            with state.lock:
                state.charges.clear()
                state.refunds.clear()
                state.by_reference.clear()
                state.by_amount.clear()
                state.submits.clear()
                state.log.clear()
            return self._send(200, {"reset": True})
        if seg[1:] == ["scenarios"] and body is not None:
            scenario = {}
            for name, value in body.items():
                if name in ("reference", "amount"):
                    continue
                expected = SCENARIO_FIELDS.get(name)
                if (
                    expected is None
                    or not isinstance(value, expected)
                    or (isinstance(value, bool) and expected is not bool)
                ):
                    return self._send(400, {"error": f"bad scenario field {name!r}"})
                scenario[name] = value
            with state.lock:
                if isinstance(body.get("reference"), str):
                    state.by_reference[body["reference"]] = scenario
                elif type(body.get("amount")) is int:
                    state.by_amount[body["amount"]] = scenario
                else:
                    return self._send(400, {"error": "a scenario needs a reference or an amount"})
            return self._send(200, {"scenario": scenario})
        return self._send(404, {"error": "no such route"})
