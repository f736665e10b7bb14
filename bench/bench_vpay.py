#!/usr/bin/env python
"""vpay benchmark: enqueue, drain, idle pickup latency, with the peers' method.

Same method as /work/shared/bench-peers (README.md, common.py, pgqueuer/bench.py), on the
same PostgreSQL (127.0.0.1:5432, role root), database ``bench_vpay`` (created if missing,
``manage.py migrate`` applied):

* enqueue of 10,000 no-op jobs: ``tests.tasks.noop.enqueue()`` one by one in autocommit
  (the Django Tasks API), ``jobs.queue.enqueue()`` one by one (diagnostic: the queue
  without the Tasks layer), ``jobs.adapters.postgres.enqueue_many`` of all 10,000 in one call, and in
  chunks of 1,000. One warm-up call before the clock starts, like the peers.
* drain of 20,000 pre-enqueued ``tests.tasks.noop`` jobs by one
  ``manage.py runworker --burst --concurrency N`` process (VPAY_LOG_LEVEL=WARNING),
  completion counted in the database: the remaining ``task`` rows of ``jobs`` (vpay
  deletes finished rows) polled every ``--poll`` seconds (default 0.02; the peers poll
  every 0.1). jobs/s steady = n / (first → last completion), jobs/s incl. worker start
  = n / (launch → last completion). Verified by the 20,000 ``processed_jobs`` fence rows
  the task kind writes, zero dead letters and the worker's own report line.
* idle pickup latency: a worker running idle (not burst), queue empty, 4 s after launch;
  50 jobs 200 ms apart through ``bench.bench_tasks.record_start.enqueue()``, whose handler
  records ``time.time()`` first thing. Two enqueue stamps are taken in this process:
  just before the enqueue call (the peers' stamp, carried in the payload) and just after
  it returned (autocommit: after the commit). Bench process and worker share a host and
  so the same system clock.

Usage (from the project root, the project's venv):
  python bench/bench_vpay.py [--reps 1] [--only enq,drain,lat,explain] [--concurrency 1,4,16]
Results: bench/out/vpay.jsonl (one JSON object a line), bench/out/vpay_tables.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import target  # noqa: E402

OUT = target.OUT
DB = target.name("bench_vpay")
DATABASE_URL = target.url(DB)
LIB = "vpay"
NOOP_PATH = "tests.tasks.noop"

# Before Django reads its settings: this process and every worker it starts use bench_vpay.
os.environ["DATABASE_URL"] = DATABASE_URL
os.environ["DJANGO_SETTINGS_MODULE"] = "vpay.settings"
os.environ.setdefault("VPAY_LOG_LEVEL", "WARNING")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

LAT_DDL = """CREATE TABLE IF NOT EXISTS bench_latency (
    lib text NOT NULL, run text NOT NULL, seq int NOT NULL,
    enq double precision NOT NULL, started double precision NOT NULL)"""
TABLES = ["jobs", "processed_jobs", "dead_letters"]


# ---------- database helpers (as bench-peers/common.py) ----------
def dsn(db: str = DB) -> str:
    return target.url(db)


def ensure_db(fresh: bool = True) -> None:
    """Create the bench database. ``fresh``: drop it first, so its schema is exactly what the
    measured code's migrations make (a migration edited in place would otherwise linger)."""
    with psycopg.connect(dsn("postgres"), autocommit=True) as c:
        if fresh:
            c.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        if not c.execute("select 1 from pg_database where datname=%s", (DB,)).fetchone():
            c.execute(f'CREATE DATABASE "{DB}"')


def sql(*stmts: str) -> None:
    with psycopg.connect(dsn(), autocommit=True) as c:
        for s in stmts:
            c.execute(s)


def scalar(q: str):
    with psycopg.connect(dsn(), autocommit=True) as c:
        return c.execute(q).fetchone()[0]


def settle() -> None:
    """Same starting state before every measured phase: vacuum+analyze, checkpoint."""
    with psycopg.connect(dsn(), autocommit=True) as c:
        for t in TABLES:
            c.execute(f"VACUUM ANALYZE {t}")
        c.execute("CHECKPOINT")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def foreign_activity() -> list[str]:
    """Other heavy work on this shared machine right now (test runs, other workers)."""
    out = subprocess.run(["pgrep", "-af", "pytest|runworker|bench.py"], capture_output=True, text=True).stdout
    mine = {str(os.getpid())}
    return [line[:120] for line in out.splitlines() if line.split(" ", 1)[0] not in mine and "pgrep" not in line]


def emit(rec: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rec = {"lib": LIB, "ts": time.time(), **rec, "loadavg_after": loadavg(), "foreign_activity": foreign_activity()}
    with open(OUT / f"{LIB}.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    short = {k: v for k, v in rec.items() if k not in ("lats_ms", "lats_after_commit_ms")}
    print(json.dumps(short), flush=True)


def manage(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), *args]


def worker_env() -> dict:
    return {**os.environ, "DATABASE_URL": DATABASE_URL, "VPAY_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}


def setup(fresh: bool = True) -> None:
    ensure_db(fresh)
    subprocess.run(manage("migrate", "--no-input", "-v", "0"), cwd=ROOT, env=worker_env(), check=True)
    sql(LAT_DDL)
    import django

    django.setup()


def reset() -> None:
    from django.db import connection

    connection.close()
    sql(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY", "TRUNCATE bench_latency")
    settle()


def count_tasks() -> int:
    return scalar("select count(*) from jobs where kind = 'task'")


def noop_payload() -> dict:
    # Exactly what VpayTaskBackend.enqueue writes for tests.tasks.noop.enqueue().
    return {"task": NOOP_PATH, "args": [], "kwargs": {}, "backend": "default"}


# ---------- enqueue ----------
def enqueue_tasks_one_by_one(n: int) -> float:
    from tests.tasks import noop

    reset()
    noop.enqueue()  # warm the connection and imports (not counted)
    t0 = time.perf_counter()
    for _ in range(n):
        noop.enqueue()
    dt = time.perf_counter() - t0
    assert count_tasks() == n + 1
    return n / dt


def enqueue_queue_one_by_one(n: int) -> float:
    from jobs.adapters import postgres as queue
    from jobs.kinds import JobKind

    reset()
    queue.enqueue(JobKind.TASK, noop_payload())
    t0 = time.perf_counter()
    for _ in range(n):
        queue.enqueue(JobKind.TASK, noop_payload())
    dt = time.perf_counter() - t0
    assert count_tasks() == n + 1
    return n / dt


def enqueue_bulk(n: int, chunk: int, distinct: bool = False) -> float:
    """``enqueue_many`` of ``n`` no-op jobs in calls of ``chunk``, the request list built in
    the timed region. As the peers' harness does (``[PAYLOAD] * n``), the list repeats one
    request; ``distinct`` builds a fresh request and payload dict per job instead (what an
    application holding 10,000 different payloads pays on top, mostly allocation)."""
    from jobs.adapters import postgres as queue
    from jobs.adapters.postgres import JobRequest
    from jobs.kinds import JobKind

    reset()
    queue.enqueue_many([JobRequest(JobKind.TASK, noop_payload())])
    request = JobRequest(JobKind.TASK, noop_payload())
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        k = min(n, start + chunk) - start
        if distinct:
            queue.enqueue_many([JobRequest(JobKind.TASK, noop_payload()) for _ in range(k)])
        else:
            queue.enqueue_many([request] * k)
    dt = time.perf_counter() - t0
    assert count_tasks() == n + 1
    return n / dt


def prefill(n: int) -> None:
    from django.db import connection

    from jobs.adapters import postgres as queue
    from jobs.adapters.postgres import JobRequest
    from jobs.kinds import JobKind

    for start in range(0, n, 1000):
        k = min(n, start + 1000) - start
        queue.enqueue_many([JobRequest(JobKind.TASK, noop_payload()) for _ in range(k)])
    connection.close()


# ---------- worker process control (as bench-peers/common.py Worker) ----------
class WorkerProc:
    def __init__(self, args: list[str], logname: str):
        OUT.mkdir(parents=True, exist_ok=True)
        self.log_path = OUT / logname
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.t_launch = time.time()
        self.p = subprocess.Popen(
            manage("runworker", *args),
            cwd=str(ROOT),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=worker_env(),
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM this worker's PID; SIGKILL the same PID after ``grace`` seconds."""
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.kill(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=10)
        self.log.close()
        return self.p.returncode

    def report_line(self) -> str | None:
        for line in self.log_path.read_text().splitlines():
            if line.startswith("runworker report:"):
                return line.split(":", 1)[1].strip()
        return None


def wait_drained(remaining_sql: str, n: int, w: WorkerProc, timeout: float, poll: float) -> dict:
    """Poll ``remaining_sql`` until 0 (bounded by ``timeout``): t_first = first poll with
    remaining < n, t_done = first poll with remaining == 0."""
    t_first = None
    polls = 0
    deadline = time.time() + timeout
    with psycopg.connect(dsn(), autocommit=True) as c:
        while time.time() < deadline:
            rem = c.execute(remaining_sql).fetchone()[0]
            now = time.time()
            polls += 1
            if t_first is None and rem < n:
                t_first = now
            if rem == 0:
                return {"t_launch": w.t_launch, "t_first": t_first, "t_done": now, "ok": True, "polls": polls}
            if not w.alive() and c.execute(remaining_sql).fetchone()[0] != 0:
                return {
                    "t_launch": w.t_launch,
                    "t_first": t_first,
                    "t_done": now,
                    "ok": False,
                    "polls": polls,
                    "error": f"worker exited rc={w.p.returncode} with {rem} remaining",
                }
            time.sleep(poll)
    return {"t_launch": w.t_launch, "t_first": t_first, "t_done": time.time(), "ok": False, "error": "timeout"}


# ---------- drain ----------
def drain(n: int, concurrency: int, rep: int, poll: float) -> dict:
    reset()
    prefill(n)
    assert count_tasks() == n
    settle()
    args = ["--burst", "--concurrency", str(concurrency)]
    load_before = loadavg()
    w = WorkerProc(args, f"{LIB}_drain_c{concurrency}_r{rep}.log")
    try:
        r = wait_drained("select count(*) from jobs where kind = 'task'", n, w, timeout=600, poll=poll)
        try:
            w.p.wait(timeout=60)  # --burst: the worker exits on its own once drained
            r["t_exit"] = time.time()
        except subprocess.TimeoutExpired:
            r["t_exit"] = None
    finally:
        rc = w.stop()
    r["rc"] = rc
    r["worker_report"] = w.report_line()
    processed = scalar("select count(*) from processed_jobs where kind = 'task'")
    dead = scalar("select count(*) from dead_letters")
    r["succeeded_in_db"] = processed
    r["dead_letters"] = dead
    r["ok"] = r["ok"] and processed == n and dead == 0 and rc == 0
    r["jobs_per_s_incl_startup"] = n / (r["t_done"] - r["t_launch"])
    # None when the whole backlog drained between two polls (no steady span to divide by).
    r["jobs_per_s_steady"] = n / (r["t_done"] - r["t_first"]) if r["t_first"] and r["t_done"] > r["t_first"] else None
    r["startup_s"] = (r["t_first"] - r["t_launch"]) if r["t_first"] else None
    r["exit_after_done_s"] = (r["t_exit"] - r["t_done"]) if r.get("t_exit") else None
    r["poll_s"] = poll
    r["concurrency"] = concurrency
    r["loadavg_before"] = load_before
    return r


# ---------- idle latency ----------
def latency(n: int, rep: int, concurrency: int, spacing: float = 0.2, idle: float = 4.0) -> dict:
    from django.db import connection

    from bench.bench_tasks import record_start

    reset()
    run = f"r{rep}c{concurrency}"
    after: dict[int, float] = {}
    before: dict[int, float] = {}
    w = WorkerProc(["--concurrency", str(concurrency)], f"{LIB}_latency_c{concurrency}_r{rep}.log")
    try:
        time.sleep(idle)  # worker up and idle, queue empty (the singleton sweep has run)
        assert w.alive()
        record_start.enqueue(run="warmup", seq=-1, enq=time.time())  # this process's connection; not counted
        time.sleep(idle / 4)
        for i in range(n):
            t = time.time()
            record_start.enqueue(run=run, seq=i, enq=t)  # autocommit: returns after the commit
            after[i] = time.time()
            before[i] = t
            time.sleep(max(0.0, t + spacing - time.time()))
        connection.close()
        deadline = time.time() + 30
        rows: list = []
        while time.time() < deadline:
            with psycopg.connect(dsn(), autocommit=True) as c:
                rows = c.execute("SELECT seq, enq, started FROM bench_latency WHERE run = %s", (run,)).fetchall()
            if len(rows) >= n:
                break
            time.sleep(0.25)
    finally:
        rc = w.stop()
    lats = [(s - e) * 1000 for _, e, s in rows]
    lats_after = [(s - after[seq]) * 1000 for seq, _, s in rows]
    enq_call = [(after[i] - before[i]) * 1000 for i in after]
    return {
        "n": len(lats),
        "concurrency": concurrency,
        "p50_ms": pct(lats, 0.5),
        "p95_ms": pct(lats, 0.95),
        "max_ms": max(lats) if lats else None,
        "after_commit_p50_ms": pct(lats_after, 0.5),
        "after_commit_p95_ms": pct(lats_after, 0.95),
        "after_commit_max_ms": max(lats_after) if lats_after else None,
        "enqueue_call_p50_ms": pct(enq_call, 0.5),
        "ok": len(lats) == n,
        "rc": rc,
        "lats_ms": [round(x, 3) for x in lats],
        "lats_after_commit_ms": [round(x, 3) for x in lats_after],
    }


# ---------- EXPLAIN ANALYZE of the claim ----------
def default_batch() -> int:
    # A worker claims one job per free executor (jobs.runner.worker): a claim for 16 free executors.
    return 16


def claim_params(worker: str = "bench-explain", batch: int | None = None) -> dict:
    from jobs import registry

    batch = batch or default_batch()

    kind_leases = {s.kind.value: s.lease_seconds for s in registry.all_specs()}
    return {
        "worker": worker,
        "queues": ["default"],
        "kinds": [s.kind.value for s in registry.all_specs()],
        "skip": [],
        "batch": batch,
        "lease": None,
        "leases": json.dumps(kind_leases),
        "default_lease": max(kind_leases.values(), default=60.0),
        "after": "",
        "max_tenants": 64,
    }


def _explain(label: str, statement: str, params) -> str:
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, VERBOSE OFF) " + statement, params)
            plan = "\n".join(r[0] for r in cursor.fetchall())
        transaction.set_rollback(True)  # EXPLAIN ANALYZE really ran the UPDATE/DELETE
    return f"### {label}\n\n```\n{plan}\n```\n"


def explain(n: int) -> dict:
    from django.db import connection, transaction

    from jobs import registry
    from jobs.storage import fence_sql, leases, repository

    reset()
    prefill(n)
    settle()
    params = claim_params()
    batch = params["batch"]
    texts = [
        f"Backlog: {n} claimable `task` rows, one tenant (''), one queue; VACUUM ANALYZE + CHECKPOINT first. "
        f"Parameters as the worker sends them (batch {batch}, max_tenants 64, after ''). Each EXPLAIN ANALYZE "
        "runs inside a transaction that is rolled back.\n"
    ]

    def claim_batch():
        return leases.claim(
            worker="bench-explain",
            queues=["default"],
            kinds=[s.kind.value for s in registry.all_specs()],
            batch=batch,
            lease_seconds=None,
            kind_leases=json.loads(params["leases"]),
            default_lease=params["default_lease"],
            after="",
            max_tenants=64,
        )

    _explain("warm-up (discarded)", leases.CLAIM, params)
    timings = {}
    for i in range(3):
        texts.append(_explain(f"CLAIM (batch {batch}), fresh backlog of {n}, run {i + 1}", leases.CLAIM, params))
    timings["claim_fresh"] = _exec_ms(texts[-1])
    # Mid-drain, as the worker sees it: half the backlog claimed and finished (deleted)
    # through the real statements, no VACUUM since (autovacuum is off on this server).
    done = 0
    while done < n // 2:
        res = claim_batch()
        held = [(j.id, j.lease_token) for j in res.jobs]
        if hasattr(repository, "fence_and_finish"):  # as the worker settles a fenced group
            with transaction.atomic():
                fence_sql.fence_and_finish(
                    fences=[(j.job_id, j.kind, NOOP_PATH) for j in res.jobs], leases=held, ttl_seconds=3600.0
                )
        else:
            repository.finish_many(held)
        done += len(res.jobs)
    texts.append(
        _explain(
            f"CLAIM (batch {batch}) after {done} claimed and settled (fence rows written, jobs deleted), no VACUUM",
            leases.CLAIM,
            params,
        )
    )
    timings["claim_half_drained"] = _exec_ms(texts[-1])
    # The settle statements of one claimed batch, for comparison.
    res = claim_batch()
    held = [(j.id, j.lease_token) for j in res.jobs]
    texts.append(
        _explain(
            f"finish_many (DELETE of one batch of {len(held)}, each with its fence row, as the completer"
            " acknowledges fenced no-ops)",
            repository._FINISH_MANY,
            {
                "ids": [i for i, _ in held],
                "tokens": [t for _, t in held],
                "once": [i for i, _ in held],
                "ttl": 3600.0,
                "fence_ids": [i for i, _ in held],
                "fence_kinds": [j.kind for j in res.jobs],
                "fence_subjects": [NOOP_PATH for _ in res.jobs],
            },
        )
    )
    timings["finish_many"] = _exec_ms(texts[-1])
    texts.append(
        _explain(
            f"fence_and_finish (fence INSERT + DELETE of one batch of {len(held)})",
            fence_sql._FENCE_AND_FINISH,
            {
                "ttl": 3600.0,
                "job_ids": [j.job_id for j in res.jobs],
                "kinds": [j.kind for j in res.jobs],
                "subjects": [NOOP_PATH for _ in res.jobs],
                "ids": [i for i, _ in held],
                "tokens": [t for _, t in held],
            },
        )
    )
    timings["fence_and_finish"] = _exec_ms(texts[-1])
    connection.close()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "claim_explain.md").write_text("\n".join(texts))
    return {"backlog": n, "batch": batch, "execution_ms": timings}


def _exec_ms(text: str) -> float | None:
    for line in text.splitlines():
        if line.strip().startswith("Execution Time:"):
            return float(line.split(":")[1].split()[0])
    return None


def versions() -> dict:
    from importlib.metadata import version

    out = {"python": sys.version.split()[0]}
    for d in ("Django", "django-tasks", "psycopg"):
        out[d] = version(d)
    if os.environ.get("VPAY_BENCH_SOURCE"):  # set by bench/run.sh
        out["vpay_source"] = os.environ["VPAY_BENCH_SOURCE"]
    try:
        out["vpay_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":!bench"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        out["vpay_tree"] = "dirty outside bench/" if dirty else "clean outside bench/"
    except (OSError, subprocess.CalledProcessError):
        pass
    out["server"] = scalar("show server_version")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--n-enq", type=int, default=10000)
    ap.add_argument("--n-drain", type=int, default=20000)
    ap.add_argument("--n-lat", type=int, default=50)
    ap.add_argument("--concurrency", default="1,4,16", help="drain concurrencies")
    ap.add_argument("--lat-concurrency", default="4,1", help="idle-latency worker concurrencies (4 = default)")
    ap.add_argument("--poll", type=float, default=0.02, help="drain completion poll interval, seconds")
    ap.add_argument("--only", default="enq,drain,lat,explain")
    ap.add_argument("--lat-idle", type=float, default=4.0, help="seconds the latency worker idles before the first job")
    a = ap.parse_args()
    only = a.only.split(",")
    setup()
    emit({"kind": "versions", **versions()})
    for rep in range(1, a.reps + 1):
        if "enq" in only:
            emit(
                {
                    "kind": "enqueue",
                    "variant": "Tasks API noop.enqueue() one-by-one (autocommit)",
                    "rep": rep,
                    "jobs_per_s": enqueue_tasks_one_by_one(a.n_enq),
                }
            )
            emit(
                {
                    "kind": "enqueue",
                    "variant": "jobs.queue.enqueue() one-by-one (autocommit; no Tasks layer)",
                    "rep": rep,
                    "jobs_per_s": enqueue_queue_one_by_one(a.n_enq),
                }
            )
            emit(
                {
                    "kind": "enqueue",
                    "variant": f"jobs.queue.enqueue_many() x{a.n_enq} in one call",
                    "rep": rep,
                    "jobs_per_s": enqueue_bulk(a.n_enq, a.n_enq),
                }
            )
            emit(
                {
                    "kind": "enqueue",
                    "variant": "jobs.queue.enqueue_many() in chunks of 1,000",
                    "rep": rep,
                    "jobs_per_s": enqueue_bulk(a.n_enq, 1000),
                }
            )
            emit(
                {
                    "kind": "enqueue",
                    "variant": f"jobs.queue.enqueue_many() x{a.n_enq} in one call, a distinct payload dict per job",
                    "rep": rep,
                    "jobs_per_s": enqueue_bulk(a.n_enq, a.n_enq, distinct=True),
                }
            )
        if "drain" in only:
            for conc in (int(c) for c in a.concurrency.split(",")):
                r = drain(a.n_drain, conc, rep, a.poll)
                variant = f"runworker --burst --concurrency {conc}"
                emit({"kind": "drain", "variant": variant, "rep": rep, **r})
        if "lat" in only:
            for conc in (int(c) for c in a.lat_concurrency.split(",")):
                emit(
                    {
                        "kind": "latency",
                        "variant": f"runworker --concurrency {conc} (LISTEN/NOTIFY)",
                        "rep": rep,
                        **latency(a.n_lat, rep, conc, idle=a.lat_idle),
                    }
                )
    if "explain" in only:
        emit({"kind": "explain", **explain(a.n_drain)})
    from bench.report import vpay_tables

    (OUT / "vpay_tables.md").write_text(vpay_tables(OUT / f"{LIB}.jsonl"))


if __name__ == "__main__":
    main()
