"""At-cap churn: how often deliver jobs queued behind one slow endpoint are claimed only to
find the endpoint at its limit (review finding 5).

One endpoint answering in ``--delay`` seconds, a backlog of ``--events`` deliveries to it,
one ``runworker`` (``--concurrency``) with ``VPAY_WEBHOOK_MAX_IN_FLIGHT=--cap``, run for
``--seconds``. Reported: the worker's ``vpay_webhook_at_cap_total`` per second (each is a
claim, a transaction and a row lock on the endpoint that delivered nothing) and the
deliveries per second that went through meanwhile.

Usage (project root): python bench/bench_webhook_at_cap.py [--events 300] [--delay 1]
    [--cap 2] [--concurrency 4] [--seconds 20]
Uses the ``bench_webhooks`` database (see bench_webhooks.py); appends to bench/out/webhooks.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bench_webhooks as bw  # sets DATABASE_URL for this process
from bench.receivers import SandboxReceiver, free_port


def at_cap_total(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    match = re.search(r"^vpay_webhook_at_cap_total (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def wait_for_metrics(port: int, timeout: float = 60.0) -> None:
    """Until the worker serves its metrics: a loaded machine boots it in more than seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            at_cap_total(port)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument("--cap", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    bw.ensure_database()
    bw.reset()
    receiver = SandboxReceiver()  # its slow mode is the endpoint at the cap
    metrics_port = free_port()
    worker = None
    try:
        merchant = bw.setup_merchant(receiver, 0)
        from webhooks.services.endpoints import create_endpoint

        _, secret = create_endpoint(
            merchant, url=f"http://127.0.0.1:{receiver.port}/slow?mode=slow&delay={args.delay}", enabled_events=["*"]
        )
        receiver.add_secrets([secret])
        bw.emit(merchant, args.events)
        env = {**bw.WORKER_ENV, "VPAY_WEBHOOK_MAX_IN_FLIGHT": str(args.cap)}
        worker = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runworker",
                "--concurrency",
                str(args.concurrency),
                "--metrics-port",
                str(metrics_port),
            ],
            cwd=bw.ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_metrics(metrics_port)
        time.sleep(3.0)  # the fan-out
        before, delivered_before, started = at_cap_total(metrics_port), bw.succeeded(), time.monotonic()
        time.sleep(args.seconds)
        after, delivered_after = at_cap_total(metrics_port), bw.succeeded()
        elapsed = time.monotonic() - started
    finally:
        if worker is not None:
            bw.stop_worker(worker)  # a failed run leaves no worker behind
        receiver.stop()
    record = {
        "measure": "at_cap_churn",
        "events": args.events,
        "delay_s": args.delay,
        "cap": args.cap,
        "concurrency": args.concurrency,
        "at_cap_per_s": round((after - before) / elapsed, 1),
        "deliveries_per_s": round((delivered_after - delivered_before) / elapsed, 2),
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    bw.OUT.mkdir(parents=True, exist_ok=True)
    with (bw.OUT / "webhooks.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    os.chdir(bw.ROOT)
    main()
