#!/usr/bin/env python
"""The SQL one webhook delivery costs: every statement the worker sends for it, listed.

One merchant, one endpoint on a local nginx (the same receiver as ``bench_webhooks.py``),
one event. The fan-out runs first (its statements are the event's, shared by all its
deliveries, and listed apart); then one deliver job is claimed, run and settled on this
thread by the worker's own ``run_once``, under Django's query capture. The settle is the
completer's batched ``DELETE`` in a running worker (one statement per batch); here it is
this job's alone.

Usage (project root, the project's venv; database ``bench_webhooks`` as the benchmark):
  python bench/statements_webhooks.py [--deliveries 3]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_webhooks as bw  # noqa: E402  (sets DATABASE_URL and the settings module)

from bench.receivers import NginxReceiver  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deliveries", type=int, default=3, help="deliveries run (the first warms the caches)")
    parser.add_argument("--verbose", action="store_true", help="print every statement")
    args = parser.parse_args()
    bw.ensure_database()
    bw.reset()
    receiver = NginxReceiver()
    try:
        import django

        django.setup()
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from jobs.runner.worker import Worker
        from webhooks.services.fanout import drain_once

        merchant = bw.setup_merchant(receiver, 1)
        bw.emit(merchant, args.deliveries)
        worker = Worker(worker_id="statements", concurrency=1, queues=["default"])
        with CaptureQueriesContext(connection) as fan_out:
            drain_once()
        print(f"fan-out of {args.deliveries} events: {len(fan_out.captured_queries)} statements")
        counts = []
        for n in range(args.deliveries):
            with CaptureQueriesContext(connection) as run:
                claimed = worker.run_once()
            worker.completer.drain(10) if hasattr(worker, "completer") else None
            statements = [q["sql"] for q in run.captured_queries]
            counts.append(len(statements))
            if args.verbose or n == args.deliveries - 1:
                print(f"\n-- delivery {n + 1} (claimed {claimed}): {len(statements)} statements")
                for sql in statements:
                    print("  " + " ".join(sql.split())[:160])
        print(f"\nstatements per delivery (claim, run, settle): {counts}")
        print(f"received by nginx: {len(receiver.received())}")
    finally:
        receiver.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VPAY_LOG_LEVEL", "WARNING")
    sys.exit(main())
