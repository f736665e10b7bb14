"""The sandbox rail: a stand-alone HTTP process speaking the rail protocol (docs/architecture.md §5).

    python -m sandbox.rail --port 8701 [--host 127.0.0.1] [--api-key sandbox-rail-key]

It is a real server reached over HTTP exactly as a production rail is; it imports nothing
of the product, and nothing of the product imports it. One process serves two rails, one
per flow, by path prefix: ``{base}/push`` and ``{base}/redirect``.

Rail protocol (every call needs ``Authorization: Bearer <api key>``, else 401):

* ``POST /<rail>/charges`` ``{reference, amount, currency, capture?}``, ``Idempotency-Key:
  reference`` → ``{status: "pending", reference, pay_token?, redirect_url?}``. The same
  reference twice is the same charge (the second answer repeats the first's token; the
  first submit's ``capture`` holds). ``capture`` (boolean, default true) false makes the
  charge an *authorization*: it polls as any charge but answers ``authorized`` (with
  ``amount_capturable``) where it would answer ``succeeded``, and stays so until captured
  or voided.
* ``GET /<rail>/charges/<reference>`` (``?pay_token=`` on the redirect rail: without the
  right token the rail does not know the charge) → the same shape, or 404.
* ``GET /redirect/pay/<reference>?pay_token=…&result=succeeded|failed``: the payer's
  page (the demo's "pay" button); settles the charge at the next poll (an authorization at
  once, for good: ``authorized`` or ``failed``). A voided charge's page is a 404.
* ``POST /<rail>/charges/<reference>/capture`` ``{amount}`` (> 0), ``Idempotency-Key:
  reference:capture`` → ``{reference, status: "succeeded", amount_captured}``: captures
  ``amount`` (at most the authorized amount; the rest is released) of an authorization a
  poll or the payer page has settled ``authorized``. Again once captured: the same answer,
  nothing more captured, whatever the amount. Anything else (pending, failed, voided, a
  capture-true charge, too much, a bad body) is a 400; an unknown reference a 404. From
  then on polls answer ``succeeded`` with ``amount_captured`` (after any ``error_polls``).
* ``POST /<rail>/charges/<reference>/void``, ``Idempotency-Key: reference:void`` → the
  charge as it stands after it: ``{reference, status: "canceled"}`` when it was pending or
  authorized (released: polls answer ``canceled`` from then on, captures are refused),
  else what the rail has already answered for it: ``succeeded`` (with ``amount_captured``)
  or ``failed`` (with ``failure_code``); 404 for an unknown reference. A charge is
  succeeded or failed here only once a poll or the payer page has settled it so.
* ``POST /<rail>/refunds`` ``{reference, charge_reference, amount, currency}``,
  ``Idempotency-Key: reference`` → ``{reference, status: "pending"}``. The same reference
  twice is the same refund (held once). A charge the rail does not know is a 404, and
  refunds of one charge adding up past its amount a 400 (both refusals for good). An
  authorization or a voided charge takes refunds only once captured ("charge not
  captured" otherwise), up to its ``amount_captured``.
* ``GET /<rail>/refunds/<reference>`` → ``{reference, status, failure_code?}``, or 404.
  Refunds follow the same scenarios as charges (per refund reference, else per refund
  amount, else the built-in amounts), every field but the redirect ones.

How a charge behaves is its *scenario*, chosen per reference, else per amount, else by
the built-in amounts below. Fields (all optional):

``outcome`` ``"succeeded"``/``"failed"`` (default succeeded), ``failure_code``,
``after_polls`` N (the N-th counted poll answers the outcome, earlier ones pending;
default 1), ``error_polls`` N (the first N polls answer 503; -1: forever),
``error_status`` (what ``error_polls`` and ``error_submits`` answer instead of 503, e.g.
429), ``retry_after`` (a ``Retry-After`` header sent with those answers, as written),
``not_found_polls`` N (then 404 for N polls), ``error_submits`` N (the first N submits
answer 503 and are not recorded), ``drop_submits`` N (the first N submits are recorded
but answered by closing the connection: the answer is lost), ``lose_submits`` N (the
first N submits are dropped unrecorded: the rail never got them, so polls answer 404),
``submit_delay`` / ``poll_delay`` seconds (answer slowly), ``submit_status`` (answer
submits with this HTTP status, e.g. 422; the rail keeps no charge), ``submit_records``
(true: with ``submit_status``, the rail keeps the charge all the same, as a 409 "already in
progress" does), ``submit_body`` (answer accepted submits with these raw bytes instead of
the JSON answer, e.g. ``""`` or ``{"status": "weird"}``: the rail keeps the charge),
``url_style`` ``"path"`` (the redirect URL
carries the pay_token as its last path segment, ``/<rail>/pay/<reference>/<token>``,
instead of ``?pay_token=``: a URL no key-name redaction can recognise), ``echo_credentials``
true (a 401 repeats the key it was presented, as some rails' error bodies do),
``capture_error`` / ``void_error`` N (the first N captures / voids answer ``error_status``
or 503 and do nothing), ``capture_refuse`` N (the next N captures are refused, 400, and
capture nothing), ``capture_drop`` / ``void_drop`` N (the next N are applied but answered by
closing the connection), ``capture_delay`` / ``void_delay`` seconds.

Built-in amounts (minor units, ``amount % 1000``): 402 fails ``insufficient_funds``;
503 answers 503 forever; 404 is unknown for three polls, then succeeds; everything else
succeeds on its first poll.

Inspection and control for tests and demos:

* ``POST /__admin/scenarios`` ``{"reference": "…"} | {"amount": 1234}`` plus scenario
  fields (replaces that key's scenario); ``POST /__admin/reset``.
* ``GET /__admin/requests[?reference=…]``: every request received, in order (method,
  path, reference, idempotency key, body, answer status, whether it was answered).
* ``GET /__admin/charges/<reference>``: what the rail holds for it, with ``capture``,
  ``settled`` (null, ``authorized``, ``succeeded``, ``failed`` or ``canceled``: what it has
  answered for good), ``amount_captured`` and how many ``captures`` and ``voids`` it got
  (every authenticated one, errored and dropped ones too; logged as kind capture / void).
* ``GET /__admin/refunds?charge_reference=…``: the refunds the rail holds for a charge
  (what a test counts to prove a refund was held once), with how many submits each got.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from sandbox.rail_admin import AdminRoutes
from sandbox.rail_capture import CaptureRoutes
from sandbox.rail_refunds import RefundRoutes
from sandbox.rail_state import RailCharge, RailRefund, State, charge_poll

DEFAULT_API_KEY = "sandbox-rail-key"


class Handler(CaptureRoutes, RefundRoutes, AdminRoutes, BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: an answer goes out as its headers and then its body, two writes; with
    # Nagle on, the body waits for the client's delayed ACK of the headers (~40 ms on
    # Linux), and a keep-alive poll took 48 ms instead of well under one.
    disable_nagle_algorithm = True
    server: RailServer

    def log_message(self, format, *args):
        pass

    # --- plumbing ----------------------------------------------------------------------

    def _send(self, status: int, body: dict | None = None, *, raw: bytes | None = None, retry_after=None) -> None:
        data = raw if raw is not None else json.dumps(body if body is not None else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.end_headers()
        self.wfile.write(data)

    def _drop(self) -> None:
        """Close the connection without an answer: the caller sees a transport failure."""
        self.close_connection = True

    def _body(self) -> dict | None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            value = json.loads(raw or b"{}")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def _authorized(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {self.server.state.api_key}"

    def _route(self) -> tuple[str, list[str], dict]:
        parts = urlsplit(self.path)
        segments = [s for s in parts.path.split("/") if s]
        return parts.path, segments, {k: v[-1] for k, v in parse_qs(parts.query).items()}

    # --- verbs -------------------------------------------------------------------------

    def do_GET(self):
        path, seg, query = self._route()
        state = self.server.state
        if seg[:1] == ["__admin"]:
            return self._admin_get(seg, query)
        if len(seg) == 3 and seg[1] == "pay":
            return self._pay(seg[0], seg[2], query)
        if len(seg) == 4 and seg[1] == "pay":  # url_style "path": the token is the last segment
            return self._pay(seg[0], seg[2], {**query, "pay_token": seg[3]})
        if len(seg) == 3 and seg[1] == "refunds":
            return self._refund_poll(path, seg[0], seg[2])
        if len(seg) != 3 or seg[1] != "charges":
            return self._send(404, {"error": "no such route"})
        rail, reference = seg[0], seg[2]
        entry = {"method": "GET", "path": path, "rail": rail, "reference": reference, "answered": True}
        if not self._authorized():
            return self._refuse(entry, reference, None)
        with state.lock:
            charge = state.charges.get((rail, reference))
            scenario = state.scenario(reference, charge.amount if charge else None)
            if charge is None or (charge.pay_token and query.get("pay_token") != charge.pay_token):
                state.record({**entry, "status": 404})
                code, status = 404, None
            else:
                code, status = charge_poll(charge, scenario)
                state.record({**entry, "status": code, "rail_status": status, "poll": charge.polls})
        delay = scenario.get("poll_delay", 0)
        if delay:
            time.sleep(delay)
        if code == 404:
            return self._send(404, {"error": "not found"})
        if code != 200:
            return self._send(code, {"error": "unavailable"}, retry_after=scenario.get("retry_after"))
        return self._send(200, self._charge_body(charge, status, scenario))

    def do_POST(self):
        path, seg, _query = self._route()
        state = self.server.state
        body = self._body()
        if seg[:1] == ["__admin"]:
            return self._admin_post(seg, body)
        if len(seg) == 4 and seg[1] == "charges" and seg[3] in ("capture", "void"):
            return self._capture_or_void(path, seg[0], seg[2], seg[3], body)
        if len(seg) != 2 or seg[1] not in ("charges", "refunds"):
            return self._send(404, {"error": "no such route"})
        rail, refund = seg[0], seg[1] == "refunds"
        entry = {
            "method": "POST",
            "path": path,
            "kind": "refund" if refund else "charge",
            "rail": rail,
            "idempotency_key": self.headers.get("Idempotency-Key"),
            "body": body,
            "answered": True,
        }
        if not self._authorized():
            amount = body.get("amount") if body else None
            return self._refuse(entry, (body or {}).get("reference"), amount if type(amount) is int else None)
        if (
            body is None
            or not isinstance(body.get("reference"), str)
            or type(body.get("amount")) is not int
            or not isinstance(body.get("currency"), str)
            or (refund and not isinstance(body.get("charge_reference"), str))
        ):
            with state.lock:
                state.record({**entry, "status": 400})
            return self._send(
                400, {"error": "reference, amount and currency (and a refund's charge_reference) are required"}
            )
        if not refund and not isinstance(body.get("capture", True), bool):
            with state.lock:
                state.record({**entry, "status": 400})
            return self._send(400, {"error": "capture must be a boolean"})
        reference, amount = body["reference"], body["amount"]
        entry["reference"] = reference
        with state.lock:
            refused = self._refund_refusal(rail, body) if refund else None
            if refused is not None:
                state.record({**entry, "status": refused[0]})
        if refused is not None:
            return self._send(refused[0], {"error": refused[1]})
        with state.lock:
            scenario = state.scenario(reference, amount)
            seen = state.submits.get((rail, reference), 0) + 1
            state.submits[(rail, reference)] = seen
            errors = scenario.get("error_submits", 0)
            lost = scenario.get("lose_submits", 0)
            dropped = scenario.get("drop_submits", 0)
            forced_status = scenario.get("submit_status")
            if seen <= errors:
                state.record({**entry, "status": scenario.get("error_status", 503)})
                action = "error"
            elif seen <= errors + lost:
                state.record({**entry, "status": None, "answered": False, "lost": True})
                action = "lose"
            else:
                refused = bool(forced_status and forced_status != 200)
                if refund and (not refused or scenario.get("submit_records")):
                    held = state.refunds.get((rail, reference))
                    if held is None:
                        held = RailRefund(reference, rail, body["charge_reference"], amount, body["currency"])
                        state.refunds[(rail, reference)] = held
                elif not refused or scenario.get("submit_records"):
                    charge = state.charges.get((rail, reference))
                    if charge is None:
                        token = secrets.token_urlsafe(16) if rail == "redirect" else None
                        charge = RailCharge(reference, rail, amount, body["currency"], token)
                        charge.capture = body.get("capture", True)
                        state.charges[(rail, reference)] = charge
                if refused:
                    state.record({**entry, "status": forced_status})
                    action = "status"
                else:
                    action = "drop" if seen <= errors + lost + dropped else "answer"
                    state.record({**entry, "status": None if action == "drop" else 200, "answered": action != "drop"})
        delay = scenario.get("submit_delay", 0)
        if delay:
            time.sleep(delay)
        if action == "error":
            status = scenario.get("error_status", 503)
            return self._send(status, {"error": "unavailable"}, retry_after=scenario.get("retry_after"))
        if action in ("lose", "drop"):
            return self._drop()
        if action == "status":
            return self._send(forced_status, {"error": "refused"}, retry_after=scenario.get("retry_after"))
        if "submit_body" in scenario:
            return self._send(200, raw=scenario["submit_body"].encode())
        if refund:
            return self._send(200, self._refund_body(held, "pending", scenario))
        return self._send(200, self._charge_body(charge, "pending", scenario))

    # --- pieces ------------------------------------------------------------------------

    def _refuse(self, entry: dict, reference: object, amount: int | None) -> None:
        """A 401; with ``echo_credentials`` its body repeats the key presented."""
        state = self.server.state
        with state.lock:
            state.record({**entry, "status": 401})
            scenario = state.scenario(reference, amount) if isinstance(reference, str) else {}
        body = {"error": "unauthorized"}
        if scenario.get("echo_credentials"):
            presented = self.headers.get("Authorization", "").removeprefix("Bearer ")
            body["detail"] = f"no account has the key {presented}"
        return self._send(401, body)

    def _charge_body(self, charge: RailCharge, status: str, scenario: dict) -> dict:
        body = {"status": status, "reference": charge.reference}
        if charge.pay_token:
            host = self.headers.get("Host", "127.0.0.1")
            body["pay_token"] = charge.pay_token
            if scenario.get("url_style") == "path":  # the token as a path segment, not `pay_token=`
                body["redirect_url"] = f"http://{host}/{charge.rail}/pay/{charge.reference}/{charge.pay_token}"
            else:
                body["redirect_url"] = (
                    f"http://{host}/{charge.rail}/pay/{charge.reference}?pay_token={charge.pay_token}"
                )
        if status == "failed":
            body["failure_code"] = scenario.get("failure_code", "declined")
        elif status == "authorized":
            body["amount_capturable"] = charge.amount
        elif status == "succeeded" and charge.amount_captured is not None:
            body["amount_captured"] = charge.amount_captured
        return body

    def _pay(self, rail: str, reference: str, query: dict) -> None:
        state = self.server.state
        with state.lock:
            charge = state.charges.get((rail, reference))
            if charge is None or query.get("pay_token") != charge.pay_token or charge.settled == "canceled":
                return self._send(404, {"error": "not found"})
            result = query.get("result", "succeeded")
            if result in ("succeeded", "failed") and (charge.capture or charge.settled is None):
                charge.forced = result
                charge.settled = "authorized" if result == "succeeded" and not charge.capture else result
        return self._send(200, {"reference": reference, "result": charge.forced})


class RailServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api_key: str) -> None:
        super().__init__(address, Handler)
        self.state = State(api_key=api_key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="vpay sandbox rail (development and tests only)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8701)
    parser.add_argument("--api-key", default=DEFAULT_API_KEY)
    args = parser.parse_args(argv)
    server = RailServer((args.host, args.port), args.api_key)
    print(f"sandbox rail listening on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
