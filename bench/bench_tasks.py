"""Bench-only @task functions (enqueued by bench/bench_vpay.py, run by a real runworker).

``record_start`` takes ``time.time()`` as its very first statement and writes it, with the
enqueue timestamp it was given, into ``bench_latency`` (created by bench_vpay.py). The
bench process and the worker run on the same host, so both read the same system clock.
"""

from __future__ import annotations

import time

from django.db import connection
from django_tasks import task


@task
def record_start(run: str, seq: int, enq: float) -> None:
    started = time.time()  # first thing: the handler's start
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bench_latency (lib, run, seq, enq, started) VALUES ('vpay', %s, %s, %s, %s)",
            [run, seq, enq, started],
        )
