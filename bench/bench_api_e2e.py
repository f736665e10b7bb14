#!/usr/bin/env python
"""End to end through the HTTP API: create, confirm, settle, webhook received.

Real processes throughout, on the PostgreSQL at 127.0.0.1:5432 (database ``bench_api``,
dropped and created afresh): gunicorn serving ``vpay.wsgi`` (``--workers`` processes of 8
threads), one ``manage.py runworker``, the sandbox rail (``sandbox.rail``, answering
``succeeded`` on the first poll), and nginx as the merchant's webhook receiver (``bench/receivers.py``,
as ``bench_webhooks.py`` uses). One merchant, one API key, one endpoint
subscribed to ``payment_intent.succeeded``.

``--clients`` threads each run their share of ``--payments`` flows over a keep-alive
connection: ``POST /v1/payment_intents``, then ``POST /v1/payment_intents/{id}/confirm``.
By default each client starts its next flow when the last one is answered (closed loop: a
cheaper server is sent more). ``--rate R`` is an open loop instead: payment k starts at
R per second from the first (k / R seconds in), on the client whose turn it is, and its
create → webhook is counted from that scheduled start, so a client that fell behind shows
as latency rather than as a slower rate (the latency target judged at a rate the machine
is asked for, not the most it can take).

* payments/s = payments ÷ (the first create sent → the last ``payment_intent.succeeded``
  webhook received by nginx), all on this host's clock;
* create → webhook received, per payment (p50, p99);
* confirm as the client waits for it (p50, p99);
* CPU ms per payment, of the machine and by role (the web process, the worker, the rail,
  the database's backends and server, nginx, the kernel, the clients), over the same span;
* limits measured in the same run: the rail alone (GETs/s) and PostgreSQL's commit rate
  (``pgbench``, one-row insert), at the client count.

Usage (project root, the project's venv; needs Debian's nginx-light and pgbench):
  python bench/bench_api_e2e.py [--payments 1000] [--clients 16] [--concurrency 16] [--workers 2] [--rate R]
      [--worker-root <another checkout, same schema: its worker, for an A/B>] [--logs <dir>]
Results: printed, and appended to bench/out/api_e2e.jsonl; the processes' output of the last
run in bench/out/api_e2e_logs (or --logs), and the three slowest payments stage by stage.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench import cpu_roles, target  # noqa: E402
from bench.receivers import NginxReceiver, free_port  # noqa: E402
from bench.sandbox_rails import sandbox_rails_file  # noqa: E402

DB = target.name("bench_api")
DATABASE_URL = target.url(DB)
RAIL_PORT = free_port()
RAILS_FILE = sandbox_rails_file(RAIL_PORT)
os.environ.update(
    {
        "DATABASE_URL": DATABASE_URL,
        "DJANGO_SETTINGS_MODULE": "vpay.settings",
        "VPAY_RAILS_FILE": str(RAILS_FILE),
        "VPAY_LOG_LEVEL": "WARNING",
        "VPAY_LOG_FORMAT": "json",
        "VPAY_WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32",
        "VPAY_DB_APPLICATION_NAME": "bench",
        # One merchant makes every request here: its default limit (100 a second) would
        # answer 429 before anything else is measured. 0: no limit.
        "VPAY_API_RATE_LIMIT": os.environ.get("VPAY_API_RATE_LIMIT", "0"),
    }
)
OUT = target.OUT

import psycopg  # noqa: E402


def fresh_database() -> None:
    with psycopg.connect(target.url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)


# --logs: the directory each process's output is written to (rail.log, web.log, worker.log).
LOGS: Path | None = None


def start(command: list[str], cwd: Path = ROOT, role: str = "") -> subprocess.Popen:
    if not (LOGS and role):
        out = subprocess.DEVNULL
        return subprocess.Popen(command, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=out, stderr=out)
    with open(LOGS / f"{role}.log", "w") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            command, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT
        )


def wait_http(url: str) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # answered (a 401 without a key is an answer)
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def setup(receiver) -> str:
    import django

    django.setup()
    from django.db import connection

    from merchants.services import create_merchant
    from webhooks.services.endpoints import create_endpoint

    merchant, key = create_merchant("API bench")
    create_endpoint(merchant, url=f"http://127.0.0.1:{receiver.port}/ep0", enabled_events=["payment_intent.succeeded"])
    connection.close()
    return key


class Client:
    """One keep-alive connection to gunicorn."""

    def __init__(self, port: int, key: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def post(self, path: str, body: dict | None = None) -> dict:
        self.conn.request("POST", path, body=json.dumps(body or {}), headers=self.headers)
        response = self.conn.getresponse()
        data = json.loads(response.read())
        if response.status >= 300:
            raise RuntimeError(f"POST {path}: {response.status} {data}")
        return data


# Where a payment's time goes after its settlement, medians from the rows' own timestamps
# (the database clock): the event (written in the settlement's transaction) → its delivery
# row (the fan-out drain), → the first attempt row.
_AFTER_SETTLEMENT = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM d.created_at - ev.created_at)),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM d.created_at - ev.created_at)),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.created_at - d.created_at))
  FROM events ev
  JOIN webhook_deliveries d ON d.event_id = ev.id
  JOIN LATERAL (SELECT min(t.started_at) AS created_at FROM webhook_delivery_attempts t WHERE t.delivery_id = d.id) a ON true
 WHERE ev.type = 'payment_intent.succeeded'
"""

# The slowest payments, stage by stage (ms), from the rows' own timestamps: submit answered →
# first status poll sent → event → delivery row → first attempt. Kept with the results, so a
# straggler leaves evidence (a 50 s hold once: bench/CHARGES.md). Each charge's requests by
# provider_requests_charge_op; the rest by primary keys and the events' type.
_SLOWEST = """
SELECT c.id, round(extract(epoch FROM a.started - i.created_at) * 1000),
       round(extract(epoch FROM r.polled - r.answered) * 1000), round(extract(epoch FROM ev.created_at - r.polled) * 1000),
       round(extract(epoch FROM d.created_at - ev.created_at) * 1000), round(extract(epoch FROM a.started - d.created_at) * 1000)
  FROM payment_intents i
  JOIN charges c ON c.intent_id = i.id
  JOIN events ev ON ev.type = 'payment_intent.succeeded' AND ev.data->>'id' = i.id
  JOIN webhook_deliveries d ON d.event_id = ev.id
  JOIN LATERAL (SELECT min(t.started_at) AS started FROM webhook_delivery_attempts t WHERE t.delivery_id = d.id) a ON true
  JOIN LATERAL (SELECT min(q.answered_at) FILTER (WHERE q.operation = 'submit') AS answered,
                       min(q.sent_at) FILTER (WHERE q.operation = 'status') AS polled
                  FROM provider_requests q WHERE q.charge_id = c.id) r ON true
 ORDER BY a.started - i.created_at DESC NULLS LAST LIMIT 3
"""

SLOWEST_FIELDS = (
    "charge",
    "create_to_attempt",
    "submit_to_poll",
    "poll_to_event",
    "event_to_delivery_row",
    "delivery_row_to_attempt",
)


def run(
    payments: int,
    clients: int,
    concurrency: int,
    workers: int,
    limits: bool,
    worker_root: Path = ROOT,
    rate: float | None = None,
) -> dict:
    fresh_database()
    receiver = NginxReceiver()
    rail = start([sys.executable, "-m", "sandbox.rail", "--port", str(RAIL_PORT)], role="rail")
    web_port = free_port()
    gunicorn = str(Path(sys.executable).with_name("gunicorn"))
    web = start([gunicorn, "vpay.wsgi:application", "--bind", f"127.0.0.1:{web_port}", "--workers", str(workers),
                 "--threads", "8", "--worker-class", "gthread", "--keep-alive", "30"], role="web")  # fmt: skip
    worker = start(
        [sys.executable, "manage.py", "runworker", "--concurrency", str(concurrency)], cwd=worker_root, role="worker"
    )
    try:
        key = setup(receiver)
        wait_http(f"http://127.0.0.1:{web_port}/v1/payment_intents")
        time.sleep(3.0)  # the worker booted and seeded
        created: dict[str, float] = {}
        confirms: list[float] = []
        lock = threading.Lock()
        shares = [payments // clients + (1 if k < payments % clients else 0) for k in range(clients)]

        def flows(c: int, n: int) -> None:
            client = Client(web_port, key)
            mine, times = {}, []
            for i in range(n):
                started = time.time()
                if rate:  # open loop: payment c + i * clients is due (c + i * clients) / rate in
                    due = first + (c + i * clients) / rate
                    if due > started:
                        time.sleep(due - started)
                    started = due
                intent = client.post("/v1/payment_intents", {"amount": 1000 + i % 7, "currency": "usd",
                                                             "rail": "sandbox_push"})  # fmt: skip
                t0 = time.perf_counter()
                client.post(f"/v1/payment_intents/{intent['id']}/confirm")
                times.append(time.perf_counter() - t0)
                mine[intent["id"]] = started
            with lock:
                created.update(mine)
                confirms.extend(times)

        roots = {"web": web.pid, "worker": worker.pid, "rail": rail.pid}
        cpu0, machine0, clients0 = cpu_roles.cpu_by_role(roots, DB), cpu_roles.machine_cpu(), _own_cpu()
        first = time.time()
        threads = [threading.Thread(target=flows, args=(c, n)) for c, n in enumerate(shares)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 600
        while len(receiver.received()) < payments and time.monotonic() < deadline:
            time.sleep(0.2)
        cpu1, machine1, clients1 = cpu_roles.cpu_by_role(roots, DB), cpu_roles.machine_cpu(), _own_cpu()
        got = receiver.received()
        with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
            intent_of = dict(
                conn.execute("SELECT id, data->>'id' FROM events WHERE type = 'payment_intent.succeeded'").fetchall()
            )
            after_settlement = conn.execute(_AFTER_SETTLEMENT).fetchone()
            slowest = [
                dict(zip(SLOWEST_FIELDS, (row[0], *(None if v is None else float(v) for v in row[1:])), strict=True))
                for row in conn.execute(_SLOWEST).fetchall()
            ]
        limit = None
        if limits:
            from bench.poll_statements import pgbench_commit_rate, rail_get_rate

            os.environ["VPAY_RAILS_FILE"] = str(RAILS_FILE)
            limit = (rail_get_rate(clients), pgbench_commit_rate(DATABASE_URL, clients))
    finally:
        for proc in (worker, web, rail):
            proc.terminate()
        for proc in (worker, web, rail):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        receiver.stop()
    receipts = {intent_of[r["event_id"]]: r["received_at"] for r in got if r["event_id"] in intent_of}
    end_to_end = sorted(receipts[i] - created[i] for i in created if i in receipts)
    confirms.sort()

    def pct(values: list[float], q: float) -> float:
        return round(values[max(0, round(q * len(values)) - 1)] * 1000, 1)

    return {
        "payments": payments,
        "clients": clients,
        "concurrency": concurrency,
        "web_workers": workers,
        "offered_per_s": rate,  # None: closed loop
        "webhooks_received": len(receipts),
        "payments_per_s": round(len(receipts) / (max(receipts.values()) - first), 1) if receipts else None,
        "create_to_webhook_p50_ms": round(statistics.median(end_to_end) * 1000, 1) if end_to_end else None,
        "create_to_webhook_p99_ms": pct(end_to_end, 0.99) if end_to_end else None,
        "confirm_p50_ms": round(statistics.median(confirms) * 1000, 1),
        "confirm_p99_ms": pct(confirms, 0.99),
        "settled_to_delivery_row_p50_ms": _ms(after_settlement[0]),
        "settled_to_delivery_row_p99_ms": _ms(after_settlement[1]),
        "delivery_row_to_attempt_p50_ms": _ms(after_settlement[2]),
        "slowest_payments_ms": slowest,
        # From the first create to the last webhook (or the wait's end): machine-wide, and by
        # role (bench/cpu_roles.py; "bench clients" is this process's own threads).
        "machine_cpu_ms_per_payment": round((machine1 - machine0) * 1000 / payments, 2),
        "cpu_ms_per_payment_by_role": {
            **cpu_roles.per_item_ms(cpu0, cpu1, payments),
            "bench clients": round((clients1 - clients0) * 1000 / payments, 3),
        },
        "worker_commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=worker_root, capture_output=True, text=True
        ).stdout.strip(),
        "rail_alone_get_per_s": limit[0] if limit else None,
        "pgbench_tps": limit[1] if limit else None,
        "load": os.getloadavg()[0],
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _own_cpu() -> float:
    """This process's CPU seconds (its client threads), not its children's."""
    times = os.times()
    return times.user + times.system


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--payments", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16, help="the worker's --concurrency")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes (8 threads each)")
    parser.add_argument("--no-limits", action="store_true", help="skip the rail-alone and pgbench limits")
    parser.add_argument("--worker-root", type=Path, default=ROOT, help="run the worker from this checkout (A/B)")
    parser.add_argument(
        "--rate", type=float, help="open loop: start this many payments a second (default: closed loop)"
    )
    parser.add_argument(
        "--logs", type=Path, default=OUT / "api_e2e_logs", help="the rail's, web's and worker's output (each run's)"
    )
    args = parser.parse_args()
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    global LOGS
    args.logs.mkdir(parents=True, exist_ok=True)
    LOGS = args.logs
    result = run(
        args.payments,
        args.clients,
        args.concurrency,
        args.workers,
        not args.no_limits,
        args.worker_root.resolve(),
        args.rate,
    )
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "api_e2e.jsonl", "a") as fh:
        fh.write(json.dumps(result) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
