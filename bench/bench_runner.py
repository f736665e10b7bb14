"""The runner's benchmarks beside pgqueuer in one run: the mixed workload and the crash cost.

    python bench/bench_runner.py [--reps 1] [--peers-dir /tmp/vpay-bench-peers]

* **Mixed workload**: 8 jobs of 2 s and 20,000 no-op jobs enqueued together, worked at
  concurrency 16 (vpay: ``runworker --concurrency 16``; pgqueuer: ``max_concurrent_tasks=16``,
  its slow entrypoint an ``asyncio.sleep(2)``). Reported: the slow jobs' start spread (the
  first to the last start), the no-op rate while they run (no-ops completed between the
  first slow start and 2 s later, from the remaining-count polled every 20 ms), and the
  whole drain. The same method for both; pgqueuer runs from the peers' harness venv
  (``bench/peer_pgqueuer_mixed.py``), never from vpay's requirements.
* **Crash cost**: one task that SIGKILLs its own worker, enqueued with 30 ordinary tasks,
  worked by ``runworker --concurrency 4`` restarted by this script as a supervisor would,
  until the killer is dead-lettered. Reported: the attempts the neighbours spent (each
  records the attempt that ran it; a neighbour run at attempt 1 spent none), the
  neighbours' dead letters, and the restarts.

Results: one JSON line per measurement in ``bench/out/runner.jsonl``; the tables are
``bench/RESULTS.md``'s "Runner" section. Speed is never asserted in tests.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import target  # noqa: E402

OUT = target.OUT
DB = target.name("bench_vpay")
DATABASE_URL = target.url(DB)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vpay.settings")
os.environ["DATABASE_URL"] = DATABASE_URL

from bench.bench_vpay import LAT_DDL, dsn, ensure_db, manage, settle, worker_env  # noqa: E402

N_NOOP = 20_000
N_SLOW = 8
SLOW_SECONDS = 2.0
CONCURRENCY = 16


def emit(rec: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rec = {"ts": time.time(), **rec, "loadavg": Path("/proc/loadavg").read_text().strip()}
    with open(OUT / "runner.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps({k: v for k, v in rec.items() if k != "samples"}), flush=True)


def poll_remaining(remaining_sql: str, slow_sql: str, proc: subprocess.Popen, timeout: float) -> dict:
    """Poll the remaining count every 20 ms until 0; returns the series and the slow starts."""
    samples: list[tuple[float, int]] = []
    deadline = time.time() + timeout
    with psycopg.connect(dsn(), autocommit=True) as c:
        while time.time() < deadline:
            rem = c.execute(remaining_sql).fetchone()[0]
            samples.append((time.time(), rem))
            if rem == 0:
                break
            if proc.poll() is not None:
                break
            time.sleep(0.02)
        starts = [r[0] for r in c.execute(slow_sql).fetchall()]
    return {"samples": samples, "starts": sorted(starts)}


def remaining_at(samples: list[tuple[float, int]], t: float) -> float:
    """The remaining count at ``t``, linearly between the polls around it."""
    for (t0, r0), (t1, r1) in itertools.pairwise(samples):
        if t0 <= t <= t1:
            return r0 + (r1 - r0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0)
    return samples[-1][1] if t > samples[-1][0] else samples[0][1]


def summarize(lib: str, polled: dict, n_total: int) -> dict:
    samples, starts = polled["samples"], polled["starts"]
    first_start = starts[0]
    window_end = first_start + SLOW_SECONDS
    done_in_window = remaining_at(samples, first_start) - remaining_at(samples, window_end)
    t_first = next(t for t, r in samples if r < n_total)
    t_done = samples[-1][0]
    return {
        "lib": lib,
        "kind": "mixed",
        "slow_started": len(starts),
        "slow_start_spread_ms": round((starts[-1] - starts[0]) * 1000, 1),
        "noop_per_s_while_slow_run": round(done_in_window / SLOW_SECONDS),
        "drain_s": round(t_done - t_first, 2),
        "drained": samples[-1][1] == 0,
    }


def vpay_mixed(rep: int) -> dict:
    from django.db import connection

    from bench.bench_vpay import noop_payload
    from jobs.adapters import postgres as queue

    connection.close()
    with psycopg.connect(dsn(), autocommit=True) as c:
        c.execute("TRUNCATE jobs, processed_jobs, dead_letters, workers RESTART IDENTITY")
        c.execute("TRUNCATE bench_latency")
    slow = [
        queue.JobRequest(
            "task", {"task": "bench.bench_tasks.slow_start", "args": [f"mixed-{rep}", i, SLOW_SECONDS], "kwargs": {}}
        )
        for i in range(N_SLOW)
    ]
    noops = [queue.JobRequest("task", noop_payload()) for _ in range(N_NOOP)]
    queue.enqueue_many(slow + noops)  # one statement: enqueued together
    connection.close()
    settle()
    log = open(OUT / f"runner_mixed_vpay_r{rep}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        manage("runworker", "--burst", "--concurrency", str(CONCURRENCY)),
        cwd=ROOT,
        env=worker_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        polled = poll_remaining(
            "SELECT count(*) FROM jobs WHERE kind = 'task'",
            f"SELECT started FROM bench_latency WHERE run = 'mixed-{rep}'",
            proc,
            timeout=600,
        )
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    return {**summarize("vpay", polled, N_SLOW + N_NOOP), "rep": rep, "concurrency": CONCURRENCY}


def pgqueuer_mixed(rep: int, peers_dir: Path) -> dict:
    py = peers_dir / ".venv" / "bin" / "python"
    out = subprocess.run(
        [str(py), str(ROOT / "bench" / "peer_pgqueuer_mixed.py"), "--rep", str(rep), "--concurrency", str(CONCURRENCY)],
        cwd=peers_dir / "pgqueuer",
        env={**os.environ, "PYTHONPATH": f"{peers_dir / 'pgqueuer'}:{peers_dir}:{ROOT / 'bench'}"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"pgqueuer mixed run failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    polled = json.loads(out.stdout.strip().splitlines()[-1])
    return {**summarize("pgqueuer", polled, N_SLOW + N_NOOP), "rep": rep, "concurrency": CONCURRENCY}


def crash_cost(rep: int, neighbours: int = 30) -> dict:
    from django.db import connection

    from jobs.adapters import postgres as queue

    connection.close()
    with psycopg.connect(dsn(), autocommit=True) as c:
        c.execute("TRUNCATE jobs, processed_jobs, dead_letters, workers, alerts RESTART IDENTITY")
        c.execute("TRUNCATE bench_latency")
    queue.enqueue_many(
        [
            queue.JobRequest(
                "task", {"task": "bench.bench_tasks.kill_the_process", "args": [], "kwargs": {}}, max_attempts=3
            )
        ]
        + [
            queue.JobRequest(
                "task", {"task": "bench.bench_tasks.record_attempt", "args": [f"crash-{rep}", i], "kwargs": {}}
            )
            for i in range(neighbours)
        ]
    )
    connection.close()

    def buried() -> bool:
        with psycopg.connect(dsn(), autocommit=True) as c:
            return bool(
                c.execute(
                    "SELECT count(*) FROM dead_letters WHERE payload->>'task' LIKE '%%kill_the_process'"
                ).fetchone()[0]
            )

    restarts = 0
    started = time.time()
    while not buried() and restarts < 20:
        restarts += 1
        proc = subprocess.Popen(
            manage("runworker", "--concurrency", "4", "--heartbeat", "0.5"),
            cwd=ROOT,
            env=worker_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 120
        while proc.poll() is None and not buried() and time.time() < deadline:
            time.sleep(0.1)
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    finisher = subprocess.run(
        manage("runworker", "--burst", "--concurrency", "4"), cwd=ROOT, env=worker_env(), capture_output=True
    )
    with psycopg.connect(dsn(), autocommit=True) as c:
        attempts = [r[0] for r in c.execute(f"SELECT enq FROM bench_latency WHERE run = 'crash-{rep}'").fetchall()]
        letters = c.execute("SELECT cause, attempts, payload->>'task' FROM dead_letters").fetchall()
    return {
        "lib": "vpay",
        "kind": "crash_cost",
        "rep": rep,
        "neighbours": neighbours,
        "neighbours_run": len(attempts),
        "attempts_spent_by_neighbours_on_crashes": int(sum(a - 1 for a in attempts)),
        "neighbour_dead_letters": sum(1 for _, _, task in letters if not task.endswith("kill_the_process")),
        "killer_dead_letter": [[cause, n] for cause, n, task in letters if task.endswith("kill_the_process")],
        "worker_restarts": restarts,
        "seconds_to_bury_the_killer": round(time.time() - started, 1),
        "finisher_rc": finisher.returncode,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--peers-dir", default=os.environ.get("PEERS_DIR", "/tmp/vpay-bench-peers"))
    ap.add_argument("--only", default="mixed,crash")
    a = ap.parse_args()
    ensure_db(fresh=True)
    subprocess.run(manage("migrate", "--no-input", "-v", "0"), cwd=ROOT, env=worker_env(), check=True)
    with psycopg.connect(dsn(), autocommit=True) as c:
        c.execute(LAT_DDL)
    import django

    django.setup()
    only = a.only.split(",")
    for rep in range(1, a.reps + 1):
        if "mixed" in only:
            # Alternating, pgqueuer first on odd reps: drift between the two is taken out.
            order = ["pgqueuer", "vpay"] if rep % 2 else ["vpay", "pgqueuer"]
            for lib in order:
                emit(vpay_mixed(rep) if lib == "vpay" else pgqueuer_mixed(rep, Path(a.peers_dir)))
        if "crash" in only:
            emit(crash_cost(rep))


if __name__ == "__main__":
    main()
