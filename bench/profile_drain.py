#!/usr/bin/env python
"""Where a drained job's time goes. Three views of the 20,000-job no-op drain:

  python bench/profile_drain.py --mode timers   [--n 20000] [--batch N]
      The real Worker.run_once loop in this process, one thread, with perf_counter
      wrappers around its stages (low overhead): µs per job in the claim, the group's
      fence check, the task handler (import + call), the fence+finish statement, the
      COMMIT, the prometheus calls, every cursor.execute (Django wrapper) and the psycopg
      execute inside it (network + server), and the rest of the loop.
  python bench/profile_drain.py --mode cprofile [--n 20000]
      The same loop under cProfile (inflates pure-Python costs: read it for shape).
  python bench/profile_drain.py --mode cpu      [--n 20000] [--concurrency 4]
      A real `runworker --burst` drain: CPU seconds of the worker process and of all
      PostgreSQL server processes per job (on a 2-core box, the two compete).
  python bench/profile_drain.py --mode pyspy    [--n 20000] [--concurrency 4] --py-spy PATH
      The same drain under `py-spy record --idle --threads` (wall-clock samples of every
      thread), raw collapsed stacks + speedscope in bench/out/profile/, and the loop
      threads' samples bucketed by stage.

Uses the bench database (bench_vpay), like bench_vpay.py; py-spy is not a project
dependency (install it anywhere, e.g. a throwaway venv, and pass --py-spy).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench.bench_vpay as bv


def prepare(n: int) -> None:
    bv.reset()
    bv.prefill(n)
    assert bv.count_tasks() == n
    bv.settle()


# ---------- in-process loop ----------
def in_process(a) -> None:
    import psycopg
    from django.db import connection
    from django.db.backends.utils import CursorWrapper

    from jobs import registry, repository, tasks_backend
    from jobs import worker as worker_mod
    from vpay import metrics

    acc: dict[str, float] = defaultdict(float)
    calls: Counter = Counter()

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[name] += time.perf_counter() - t
                calls[name] += 1

        return wrapper

    if a.mode == "timers":
        for fn in ("claim", "processed_among", "fence_and_finish", "finish_many", "insert_fence"):
            if hasattr(repository, fn):
                setattr(repository, fn, timed(f"sql: repository.{fn}", getattr(repository, fn)))
        spec = registry.get("task")
        object.__setattr__(spec, "handler", timed("handler: run_task (import + call)", spec.handler))
        tasks_backend._import_task = timed("  of which _import_task (import_string)", tasks_backend._import_task)
        if hasattr(worker_mod.Worker, "_run_group"):
            worker_mod.Worker._run_group = timed("loop: Worker._run_group (whole group)", worker_mod.Worker._run_group)
        CursorWrapper.execute = timed("all SQL: Django CursorWrapper.execute", CursorWrapper.execute)
        psycopg.Cursor.execute = timed("all SQL: psycopg Cursor.execute (net+server)", psycopg.Cursor.execute)
        metrics.JOB_DURATION.labels = timed("metrics: JOB_DURATION.labels", metrics.JOB_DURATION.labels)
        worker_mod.Worker._count = timed("metrics+report: Worker._count", worker_mod.Worker._count)

    w = worker_mod.Worker(concurrency=1, burst=True, batch_size=a.batch or worker_mod.DEFAULT_BATCH)
    w.boot()
    # commit() of the loop-owned transaction (wrapped after boot: the thread's connection)
    connection.ensure_connection()
    if a.mode == "timers":
        connection.commit = timed("sql: COMMIT (Django commit)", connection.commit)
    state = w.new_state()
    prof = None
    if a.mode == "cprofile":
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    jobs = 0
    while True:
        k = w.run_once(state)
        if not k:
            break
        jobs += k
    wall = time.perf_counter() - t0
    if prof:
        prof.disable()
    connection.close()
    print(
        f"{jobs} jobs (incl. the sweep singleton) in {wall:.2f} s: {jobs / wall:,.0f} jobs/s, "
        f"{wall / jobs * 1e6:,.1f} µs/job wall, one thread, batch {w.batch_size}; report {w.report().line()}"
    )
    if a.mode == "timers":
        print(f"{'stage (nested stages overlap)':52} {'µs/job':>8} {'share':>7} {'calls':>7}")
        for name, t in sorted(acc.items(), key=lambda kv: -kv[1]):
            print(f"{name:52} {t / jobs * 1e6:8.1f} {t / wall:7.1%} {calls[name]:7d}")
    else:
        import pstats

        st = pstats.Stats(prof)
        st.sort_stats("cumulative").print_stats(40)
        st.sort_stats("tottime").print_stats(30)


# ---------- real runworker ----------
def cpu_ticks(pids) -> float:
    """utime + stime of these processes, seconds (children not included)."""
    hz = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / hz


_POSTMASTER: int | None = None


def postgres_pids() -> list[int]:
    """The 127.0.0.1:5432 server's postmaster and its children (not any other cluster)."""
    global _POSTMASTER
    if _POSTMASTER is None:
        data_dir = bv.scalar("show data_directory")
        _POSTMASTER = int(Path(data_dir, "postmaster.pid").read_text().split()[0])
    postmaster = _POSTMASTER
    pids = [postmaster]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                pids.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            pass
    return pids


def real_worker(a) -> None:
    out = bv.OUT / "profile"
    out.mkdir(parents=True, exist_ok=True)
    argv = bv.manage("runworker", "--burst", "--concurrency", str(a.concurrency))
    if a.batch:
        argv += ["--batch", str(a.batch)]
    if a.mode == "pyspy":
        results = {}
        for fmt in ("raw", "speedscope"):
            prepare(a.n)
            kind = "wall" if a.idle else "cpu"
            path = out / f"drain_c{a.concurrency}_{kind}.{'txt' if fmt == 'raw' else 'speedscope.json'}"
            idle = ["--idle"] if a.idle else []
            cmd = [a.py_spy, "record", *idle, "--threads", "-r", str(a.rate), "-f", fmt, "-o", str(path), "--"]
            t0 = time.time()
            subprocess.run(cmd + argv, cwd=bv.ROOT, env=bv.worker_env(), check=True, capture_output=True)
            results[fmt] = (path, time.time() - t0)
        print(f"py-spy outputs: {results}")
        bucket(results["raw"][0], a.n)
        return
    # cpu: every process's CPU is read every 20 ms and its last reading kept (a /proc entry
    # disappears at exit, so the worker's and its backends' last readings are a few ms short).
    prepare(a.n)
    base = {q: cpu_ticks([q]) for q in postgres_pids()}
    last: dict[int, float] = dict(base)
    t0 = time.time()
    p = subprocess.Popen(argv, cwd=bv.ROOT, env=bv.worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    worker_cpu = 0.0
    while p.poll() is None:
        worker_cpu = max(worker_cpu, cpu_ticks([p.pid]))
        for q in postgres_pids():
            last[q] = max(last.get(q, 0.0), cpu_ticks([q]))
        time.sleep(0.02)
    wall = time.time() - t0
    pg = sum(v - base.get(q, 0.0) for q, v in last.items())
    print(p.stdout.read().decode().strip().splitlines()[-1])
    print(
        f"drain of {a.n} at --concurrency {a.concurrency}: wall {wall:.2f} s incl. start "
        f"({a.n / wall:,.0f} jobs/s); worker process CPU {worker_cpu:.2f} s ({worker_cpu / a.n * 1e6:.0f} µs/job, "
        f"incl. ~start-up); PostgreSQL CPU (all server processes) {pg:.2f} s ({pg / a.n * 1e6:.0f} µs/job); "
        f"2 cores = {2 * wall:.2f} CPU-s available"
    )


STAGES = [
    # (bucket, substring of a frame) — first match from the leaf upwards wins for the SQL
    # buckets; the stack's repository function names the statement.
    ("claim", "claim (jobs/repository.py"),
    ("fence check (processed_among, if present)", "processed_among (jobs/repository.py"),
    ("fence+finish statement", "fence_and_finish (jobs/repository.py"),
    ("finish_many", "finish_many (jobs/repository.py"),
    ("fence INSERT (single path)", "insert_fence (jobs/repository.py"),
]


def classify(frames: list[str]) -> tuple[str, str]:
    """(stage, layer) of one sample of a loop thread; frames root→leaf."""
    joined = ";".join(frames)
    stage = "loop (other)"
    for name, needle in STAGES:
        if needle in joined:
            stage = name
            break
    else:
        if "commit (django/db/backends/base/base.py" in joined or "__exit__ (django/db/transaction.py" in joined:
            stage = "COMMIT"
        elif "run_task (jobs/tasks_backend.py" in joined:
            stage = "handler (run_task)"
        elif "prometheus_client" in joined:
            stage = "metrics"
        elif "/logging/" in joined:
            stage = "logging"
        elif "__enter__ (django/db/transaction.py" in joined:
            stage = "BEGIN (atomic enter)"
        elif "_wait_for_work" in joined:
            stage = "idle wait"
    leaf = frames[-1] if frames else ""
    if "psycopg" in leaf:
        layer = "psycopg (network wait, server, libpq)"
    elif "django/db" in leaf:
        layer = "Django DB layer"
    elif "prometheus_client" in leaf:
        layer = "prometheus_client"
    elif "/logging/" in leaf:
        layer = "logging"
    elif "threading.py" in leaf:
        layer = "threading (locks/conditions)"
    else:
        layer = "other Python"
    return stage, layer


def bucket(raw: Path, n: int) -> None:
    by_stage: Counter = Counter()
    by_layer: Counter = Counter()
    by_both: Counter = Counter()
    threads: Counter = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = frames[0]
        threads[thread.split(" ")[0] if thread else "?"] += int(count)
        if "_loop (jobs/worker.py" not in stack:
            continue  # main, listener, maintenance threads, startup
        c = int(count)
        total += c
        stage, layer = classify(frames)
        by_stage[stage] += c
        by_layer[layer] += c
        by_both[(stage, layer)] += c
    print(f"\nloop-thread samples: {total} (all threads' samples by thread: {dict(threads.most_common(8))})")
    print(f"{'stage':36} {'share of loop-thread samples':>30}")
    for k, v in by_stage.most_common():
        print(f"{k:36} {v / total:30.1%}")
    print(f"\n{'innermost layer':40} {'share':>7}")
    for k, v in by_layer.most_common():
        print(f"{k:40} {v / total:7.1%}")
    print("\nstage x layer (top 15)")
    for (s, layer), v in by_both.most_common(15):
        print(f"  {s:34} {layer:40} {v / total:6.1%}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--mode", choices=("timers", "cprofile", "cpu", "pyspy"), default="timers")
    ap.add_argument("--batch", type=int, default=None, help="default: the worker's DEFAULT_BATCH")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--py-spy", default="py-spy")
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument(
        "--no-idle", dest="idle", action="store_false", help="py-spy: on-CPU samples only (default: wall, --idle)"
    )
    a = ap.parse_args()
    bv.setup(fresh=True)
    if a.mode in ("timers", "cprofile"):
        prepare(a.n)
        in_process(a)
    else:
        real_worker(a)


if __name__ == "__main__":
    main()
