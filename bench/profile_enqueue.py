"""Where a one-by-one enqueue's time goes: each layer of the call, interleaved in one process.

  python bench/profile_enqueue.py [--blocks 8] [--calls 500]

Against ``bench_vpay`` (127.0.0.1:5432; run ``bench/bench_vpay.py`` once to create it),
in autocommit, each call one durable commit. Layers, outermost first:

* ``noop.enqueue()``: the Django Tasks API (what bench/RESULTS.md compares with the peers);
* ``jobs.queue.enqueue()``: validation, the job id, the row;
* ``vpay.prepared.execute_prepared()``: the statement on Django's connection;
* ``PQexecPrepared`` alone: libpq on the same connection with the same statement and
  parameters, no Python around it but the parameter list: the floor for this statement
  from Python.

The layers run in turns of ``--calls`` calls, ``--blocks`` times over, so a shared machine's
drift hits them alike; the medians over the blocks are reported, with the client's own CPU
time per call (user + system, from getrusage). The difference between two adjacent layers
is what the outer one adds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import target  # noqa: E402

os.environ.setdefault("DATABASE_URL", target.url(target.name("bench_vpay")))
os.environ["DJANGO_SETTINGS_MODULE"] = "vpay.settings"
os.environ.setdefault("VPAY_LOG_LEVEL", "WARNING")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--calls", type=int, default=500)
    a = ap.parse_args()

    import django

    django.setup()
    from django.db import connection

    from jobs.adapters import postgres as queue
    from jobs.kinds import JobKind
    from jobs.storage import repository
    from tests.tasks import noop
    from vpay import prepared

    payload = {"task": "tests.tasks.noop", "args": [], "kwargs": {}, "backend": "default"}
    text = json.dumps(payload)

    def params() -> tuple:
        return (uuid.uuid4(), "task", "default", text, 0, 0.0, 0.0, 5, None, "", "", True)

    prepared.execute_prepared(repository._INSERT_ONE_FRESH, params())  # prepares it
    pgconn = connection.connection.pgconn
    name = prepared._statement(repository._INSERT_ONE_FRESH)[0]
    layers = {
        "noop.enqueue() (Tasks API)": noop.enqueue,
        "jobs.queue.enqueue()": lambda: queue.enqueue(JobKind.TASK, payload),
        "vpay.prepared.execute_prepared()": lambda: prepared.execute_prepared(repository._INSERT_ONE_FRESH, params()),
        "PQexecPrepared alone (the floor)": lambda: pgconn.exec_prepared(name, [prepared.text_param(p) for p in params()]),
    }
    wall: dict[str, list[float]] = {k: [] for k in layers}
    cpu: dict[str, list[float]] = {k: [] for k in layers}
    for _ in range(a.blocks):
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE jobs")
        for label, call in layers.items():
            for _ in range(20):
                call()
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(a.calls):
                call()
            t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            wall[label].append((t1 - t0) / a.calls * 1e6)
            cpu[label].append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / a.calls * 1e6)
    print(f"{a.blocks} blocks of {a.calls} calls each, interleaved; medians per call")
    print("| layer | wall µs | client CPU µs | calls/s |\n|---|---|---|---|")
    for label in layers:
        w = statistics.median(wall[label])
        print(f"| {label} | {w:.0f} | {statistics.median(cpu[label]):.0f} | {1e6 / w:,.0f} |")


if __name__ == "__main__":
    main()
