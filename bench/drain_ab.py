#!/usr/bin/env python
"""Two versions of the worker drain the same backlog in alternating turns, in one run.

A change to the engine is judged against the code before it on the same machine, minutes
apart, never against a number from another day (this VM's speed moves between runs). Each
turn: ``bench_vpay``'s database reset, N no-op Tasks-API tasks enqueued, VACUUM ANALYZE +
CHECKPOINT, then ``--workers`` ``manage.py runworker --burst --concurrency C`` processes of
one version, from launch until the last task row is gone. Reported per turn: jobs/s
(first completion -> last), the whole machine's CPU per job (every process: the worker,
PostgreSQL, the kernel) and the worker processes' own CPU per job, from /proc and rusage.

    python bench/drain_ab.py --ref HEAD~1 --ref WORKTREE [--concurrency 16] [--n 10000] [--reps 2]
                             [--workers 1] [--processes N]

``--ref``: a commit (exported with ``git archive`` to a scratch folder) or ``WORKTREE`` (this
checkout as it is). Each turn makes the database afresh with its version's own migrations;
the backlog is enqueued by this checkout's code, so the versions compared must share the
``jobs`` table's shape. Results: bench/out/drain_ab.jsonl and one line per turn on
stdout. Nothing else heavy should run meanwhile (bench/run.sh's quiet-machine rule).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import bench_vpay as bv  # noqa: E402  (sets DATABASE_URL to bench_vpay first)


def busy_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far (/proc/stat's first line)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def export(ref: str, into: Path) -> Path:
    if ref == "WORKTREE":
        return ROOT
    tree = into / ref.replace("/", "_").replace("~", "-").replace("^", "-")
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    tar_path = into / "export.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(tree, filter="data")
    return tree


def migrated_for(tree: Path) -> None:
    """The bench database made afresh with ``tree``'s own migrations: a worker refuses a
    database holding migrations its code does not know."""
    from django.db import connection

    connection.close()
    bv.ensure_db(fresh=True)
    subprocess.run(
        [sys.executable, str(tree / "manage.py"), "migrate", "--no-input", "-v", "0"],
        cwd=str(tree),
        env=bv.worker_env(),
        check=True,
    )
    bv.sql(bv.LAT_DDL)  # bench_vpay's own table, which its reset empties


def turn(tree: Path, ref: str, concurrency: int, n: int, workers: int, processes: int | None, rep: int) -> dict:
    migrated_for(tree)
    bv.reset()
    bv.prefill(n)
    bv.settle()
    tick = os.sysconf("SC_CLK_TCK")
    before, children_before = busy_ticks(), resource.getrusage(resource.RUSAGE_CHILDREN)
    launched = time.time()
    logs = [open(bv.OUT / f"drain_ab_{rep}_{i}.log", "w") for i in range(workers)]  # noqa: SIM115
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(tree / "manage.py"),
                "runworker",
                "--burst",
                "--concurrency",
                str(concurrency),
                *(["--processes", str(processes)] if processes else []),
            ],
            cwd=str(tree),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=bv.worker_env(),
            start_new_session=True,
        )
        for log in logs
    ]

    class Watched:  # what bench_vpay.wait_drained reads of a worker
        t_launch = launched
        p = procs[0]

        @staticmethod
        def alive() -> bool:
            return any(p.poll() is None for p in procs)

    drained = bv.wait_drained("select count(*) from jobs where kind = 'task'", n, Watched, timeout=600, poll=0.05)
    codes = [p.wait(timeout=60) for p in procs]
    for log in logs:
        log.close()
    after, children_after = busy_ticks(), resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = (children_after.ru_utime + children_after.ru_stime) - (
        children_before.ru_utime + children_before.ru_stime
    )
    seconds = drained["t_done"] - drained["t_first"] if drained.get("t_first") else None
    return {
        "kind": "drain_ab",
        "ref": ref,
        "rep": rep,
        "concurrency": concurrency,
        "workers": workers,
        "processes": processes,
        "n": n,
        "ok": drained["ok"] and codes == [0] * workers,
        "jobs_per_s": round(n / seconds) if seconds else None,
        "machine_cpu_us_per_job": round((after[0] - before[0]) / tick / n * 1e6),
        "machine_cpu_share": round((after[0] - before[0]) / max(after[1] - before[1], 1), 2),
        "worker_cpu_us_per_job": round(worker_cpu / n * 1e6),
        "loadavg": bv.loadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", action="append", required=True, help="a commit, or WORKTREE; give two (or more)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="runworker commands started per turn")
    ap.add_argument(
        "--processes", type=int, default=None, help="each runworker's --processes (default: runworker's own default)"
    )
    args = ap.parse_args()
    bv.setup()
    with tempfile.TemporaryDirectory(prefix="vpay-drain-ab-") as scratch:
        trees = {ref: export(ref, Path(scratch)) for ref in args.ref}
        bv.OUT.mkdir(parents=True, exist_ok=True)
        with open(bv.OUT / "drain_ab.jsonl", "a") as out:
            for rep in range(1, args.reps + 1):
                for ref, tree in trees.items():
                    record = turn(tree, ref, args.concurrency, args.n, args.workers, args.processes, rep)
                    out.write(json.dumps({"ts": time.time(), **record}) + "\n")
                    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
