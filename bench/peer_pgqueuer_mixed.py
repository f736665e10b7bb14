"""pgqueuer running the runner benchmark's mixed workload (bench/bench_runner.py).

Run with the peers' harness venv (it has pgqueuer; vpay's requirements never do), from the
peers' ``pgqueuer`` folder with it and its parent on PYTHONPATH. Prints, as its last line,
the remaining-count series and the slow jobs' starts, measured as bench_runner measures vpay.

    python peer_pgqueuer_mixed.py --rep 1 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import common  # the peers' harness
import psycopg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

DB = "bench_pgqueuer"
N_NOOP = 20_000
N_SLOW = 8
SLOW_SECONDS = 2.0


@asynccontextmanager
async def main():
    """The worker's factory: a no-op entrypoint and a slow one that records its start."""
    connection = await asyncpg.connect(common.url(DB))
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    @pgq.entrypoint("slow")
    async def slow(job: Job) -> None:
        d = json.loads(job.payload)
        common.record_start(DB, "pgqueuer", d["run"], d["seq"], 0.0)
        await asyncio.sleep(SLOW_SECONDS)

    try:
        yield pgq
    finally:
        await connection.close()


async def _enqueue(run: str) -> None:
    conn = await asyncpg.connect(common.url(DB))
    try:
        q = Queries(AsyncpgDriver(conn))
        slow = [json.dumps({"run": run, "seq": i}).encode() for i in range(N_SLOW)]
        await q.enqueue(["slow"] * N_SLOW + ["noop"] * N_NOOP, slow + [b'{"x": 1}'] * N_NOOP, [0] * (N_SLOW + N_NOOP))
    finally:
        await conn.close()


def run(rep: int, concurrency: int) -> dict:
    from bench import setup  # the peers' pgqueuer/bench.py (schema install)

    setup()
    common.sql(DB, "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics RESTART IDENTITY", "TRUNCATE bench_latency")
    tag = f"mixed-{rep}"
    asyncio.run(_enqueue(tag))
    common.settle(DB, ["pgqueuer", "pgqueuer_log"])
    here = Path(__file__).resolve().parent
    argv = [
        sys.executable,
        "run_worker.py",
        "peer_pgqueuer_mixed:main",
        "--batch-size",
        str(concurrency // 2),  # pgqueuer requires max_concurrent_tasks >= 2 * batch_size
        "--max-concurrent-tasks",
        str(concurrency),
    ]
    w = common.Worker(
        argv,
        Path.cwd(),
        f"runner_mixed_pgqueuer_r{rep}.log",
        {"PYTHONPATH": f"{Path.cwd()}:{Path.cwd().parent}:{here}"},
    )
    samples = []
    try:
        deadline = time.time() + 600
        with psycopg.connect(common.dsn(DB), autocommit=True) as c:
            while time.time() < deadline:
                rem = c.execute("select count(*) from pgqueuer").fetchone()[0]
                samples.append((time.time(), rem))
                if rem == 0 or not w.alive():
                    break
                time.sleep(0.02)
            starts = [r[0] for r in c.execute("select started from bench_latency where run = %s", (tag,)).fetchall()]
    finally:
        w.stop()
    return {"samples": samples, "starts": sorted(starts)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rep", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=16)
    a = ap.parse_args()
    print(json.dumps(run(a.rep, a.concurrency)))
