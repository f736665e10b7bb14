"""Bench-only @task functions (enqueued by bench/bench_vpay.py, run by a real runworker).

``record_start`` takes ``time.time()`` as its very first statement and writes it, with the
enqueue timestamp it was given, into ``bench_latency`` (created by bench_vpay.py). The
bench process and the worker run on the same host, so both read the same system clock.
"""

from __future__ import annotations

import time

from django.db import connection

from jobs.tasks_api import task


@task
def record_start(run: str, seq: int, enq: float) -> None:
    started = time.time()  # first thing: the handler's start
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bench_latency (lib, run, seq, enq, started) VALUES ('vpay', %s, %s, %s, %s)",
            [run, seq, enq, started],
        )


@task
def slow_start(run: str, seq: int, seconds: float) -> None:
    """The mixed workload's slow job: records its start (as ``record_start``), then takes
    ``seconds``, as a rail poll or a webhook POST waiting on the network would."""
    started = time.time()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bench_latency (lib, run, seq, enq, started) VALUES ('vpay', %s, %s, %s, %s)",
            [run, seq, 0.0, started],
        )
    time.sleep(seconds)


@task(takes_context=True)
def record_attempt(context, run: str, seq: int) -> None:
    """The crash-cost neighbour: records which attempt ran it (1 = nobody else's crash cost it one)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bench_latency (lib, run, seq, enq, started) VALUES ('vpay', %s, %s, %s, %s)",
            [run, seq, float(context.attempt), time.time()],
        )


@task
def kill_the_process() -> None:
    """The crash-cost job: kills its own worker, as an OOM kill or a C extension's segfault would."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
