#!/usr/bin/env python
"""Turn bench/out/vpay.jsonl and the peers' out/*.jsonl of the same run into bench/RESULTS.md.

  python bench/report.py --peers-out DIR --facts FILE [--out bench/RESULTS.md] [--rerun CMD]

Medians over reps (REPS=1: the single value). Ratios are vpay / peer, so > 1 means vpay
is faster (enqueue, drain) — for latency the ratio is vpay / peer of milliseconds, < 1
means vpay is quicker.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent

PGQ_ONE_SYNC = "sync SyncQueries.enqueue() one-by-one"
PGQ_ONE_ASYNC = "async Queries.enqueue() one-by-one"
PGQ_BULK = "async Queries.enqueue(lists) x10000"
PGQ_DRAIN = "default(unlimited, batch 10) task=noop"
PRO_ONE_SYNC = "sync defer() one-by-one"
PRO_BULK = "async batch_defer_async() x10000"
PRO_DRAIN = "concurrency=default(1) task=noop"
DJT_ONE = "task.enqueue() one-by-one (autocommit)"
DJT_ATOMIC = "task.enqueue() one-by-one inside one atomic() (no bulk API)"
DJT_DRAIN = "db_worker default (1 task at a time) CONN_MAX_AGE=persistent"
VPAY_ONE = "Tasks API noop.enqueue() one-by-one (autocommit)"
VPAY_BULK = "jobs.queue.enqueue_many() x10000 in one call"
VPAY_BULK_DISTINCT = "jobs.queue.enqueue_many() x10000 in one call, a distinct payload dict per job"
# The raw PostgreSQL limit (pgbench scripts of the peers' harness): (mode, clients) -> label.
RAW_ONE = ("enqueue_1row", 1, "pgbench: 1-row INSERT per transaction, 1 client")
RAW_BULK = ("enqueue_100row", 1, "pgbench: 100-row multi-VALUES INSERT per transaction, 1 client")
RAW_DRAIN = ("batch50_2tx", 1, "pgbench: claim 50 in one transaction + delete 50 in another, 1 client")


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def fmt(xs, nd=0):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    f = f"{{:,.{nd}f}}"
    m = statistics.median(xs)
    return f.format(m) if len(xs) == 1 else f"{f.format(m)} [{f.format(min(xs))}-{f.format(max(xs))}] n={len(xs)}"


class Lib:
    """One library's records, grouped: enqueue / drain / latency by variant."""

    def __init__(self, recs: list[dict]):
        self.recs = recs
        self.enq = defaultdict(list)
        self.drain = defaultdict(list)
        self.lat = defaultdict(list)
        self.versions = next((r for r in reversed(recs) if r["kind"] == "versions"), {})
        tables = {"enqueue": self.enq, "drain": self.drain, "latency": self.lat}
        for r in recs:
            if r["kind"] in tables:
                tables[r["kind"]][r["variant"]].append(r)

    def med(self, table: str, variant: str, key: str):
        rows = getattr(self, table).get(variant, [])
        xs = [r.get(key) for r in rows if r.get(key) is not None]
        return statistics.median(xs) if xs else None

    def best(self, table: str, key: str, prefix: str = "", lower=False):
        """(variant, median) with the best median of ``key`` among variants starting with ``prefix``."""
        cands = [(v, self.med(table, v, key)) for v in getattr(self, table) if v.startswith(prefix)]
        cands = [(v, m) for v, m in cands if m is not None]
        if not cands:
            return None, None
        return (min if lower else max)(cands, key=lambda c: c[1])


def ver_line(lib: Lib) -> str:
    return ", ".join(
        f"{k} {v}"
        for k, v in lib.versions.items()
        if k not in ("lib", "ts", "kind", "loadavg_after", "foreign_activity")
    )


def lib_tables(lib: Lib, title: str) -> str:
    s = f"#### {title}\n\nVersions: {ver_line(lib)}\n\n"
    if lib.enq:
        s += "| enqueue (10,000 no-op jobs) | jobs/s |\n|---|---|\n"
        for v, rows in lib.enq.items():
            s += f"| {v} | {fmt([r['jobs_per_s'] for r in rows])} |\n"
        s += "\n"
    if lib.drain:
        s += (
            "| drain (20,000 pre-enqueued no-op jobs, 1 worker process) | jobs/s steady (first→last completion) "
            "| jobs/s incl. worker start | worker start→first completion (s) | completed, counted in DB | ok |\n"
            "|---|---|---|---|---|---|\n"
        )
        for v, rows in lib.drain.items():
            s += (
                f"| {v} | {fmt([r.get('jobs_per_s_steady') for r in rows])} "
                f"| {fmt([r.get('jobs_per_s_incl_startup') for r in rows])} "
                f"| {fmt([r.get('startup_s') for r in rows], 2)} "
                f"| {', '.join(str(r.get('succeeded_in_db')) for r in rows)} "
                f"| {', '.join('yes' if r.get('ok') else 'NO' for r in rows)} |\n"
            )
        s += "\n"
    if lib.lat:
        s += (
            "| idle pickup latency (50 jobs, 200 ms apart) | p50 ms | p95 ms | max ms | pooled p50 / p95 ms |\n"
            "|---|---|---|---|---|\n"
        )
        for v, rows in lib.lat.items():
            pooled = [x for r in rows for x in r.get("lats_ms", [])]
            pl = f"{pct(pooled, 0.5):.2f} / {pct(pooled, 0.95):.2f} (n={len(pooled)})" if pooled else "n/a"
            s += (
                f"| {v} | {fmt([r.get('p50_ms') for r in rows], 2)} | {fmt([r.get('p95_ms') for r in rows], 2)} "
                f"| {fmt([r.get('max_ms') for r in rows], 2)} | {pl} |\n"
            )
            if any("after_commit_p50_ms" in r for r in rows):
                s += (
                    f"| ↳ same jobs, stamp taken after the enqueue's commit returned "
                    f"| {fmt([r.get('after_commit_p50_ms') for r in rows], 2)} "
                    f"| {fmt([r.get('after_commit_p95_ms') for r in rows], 2)} "
                    f"| {fmt([r.get('after_commit_max_ms') for r in rows], 2)} | enqueue call p50 "
                    f"{fmt([r.get('enqueue_call_p50_ms') for r in rows], 2)} ms |\n"
                )
        s += "\n"
    busy = [r for r in lib.recs if r.get("foreign_activity")]
    if busy:
        s += (
            "Other work was running on the machine when these records were written:\n\n"
            + "\n".join(f"    {r['kind']} {r.get('variant', '')}: {'; '.join(r['foreign_activity'])}" for r in busy)
            + "\n\n"
        )
    bad = [r for r in lib.recs if r["kind"] in ("drain", "latency") and not r.get("ok")]
    if bad:
        s += (
            "FLAGGED (not ok):\n\n"
            + "\n".join("    " + json.dumps({k: v for k, v in r.items() if not k.startswith("lats")}) for r in bad)
            + "\n\n"
        )
    return s


def vpay_tables(path: Path) -> str:
    return lib_tables(Lib(load(path)), "vpay")


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def num(x, nd=0):
    return "n/a" if x is None else f"{x:,.{nd}f}"


def load_side(path: Path) -> dict:
    """The last summary of ``bench/enqueue_side_by_side.py``: measure -> medians and ratio range."""
    summaries = [r["summary"] for r in load(path) if "summary" in r]
    return summaries[-1] if summaries else {}


def judge(x, peer, factor: float, side: dict | None) -> str:
    """Whether vpay's ``x`` is at least ``factor`` times the peer's. The enqueue targets are
    judged on the interleaved turns when they ran (``side``: their per-block ratio has the
    machine's drift taken out), the rest on the phases' medians."""
    if side:
        return "MET" if side["ratio_median"] >= factor else "not met"
    return "n/a" if x is None or peer is None else ("MET" if x >= factor * peer else "not met")


def side_row(measure: str, side: dict) -> str:
    s = side.get(measure)
    if not s:
        return "| ↳ interleaved with pgqueuer: not run | - | - | - | - | - | - | - | - | - |"
    return (
        f"| ↳ interleaved with pgqueuer, {s['blocks']} alternating turns (`bench/enqueue_side_by_side.py`): "
        f"median per-turn ratio, range {s['ratio_min']:.2f}-{s['ratio_max']:.2f}x (the target's judge) "
        f"| {num(s['vpay'])} | {num(s['pgqueuer'])} | - | - | {s['ratio_median']:.2f}x | - | - | - | - |"
    )


def comparison(v: Lib, pgq: Lib, pro: Lib, djt: Lib, side: dict) -> str:
    rows = []
    # enqueue one-by-one
    vo = v.med("enq", VPAY_ONE, "jobs_per_s")
    pgq_sync = pgq.med("enq", PGQ_ONE_SYNC, "jobs_per_s")
    pgq_async = pgq.med("enq", PGQ_ONE_ASYNC, "jobs_per_s")
    pgq_one = max([x for x in (pgq_sync, pgq_async) if x is not None], default=None)
    pro_one = pro.med("enq", PRO_ONE_SYNC, "jobs_per_s")
    djt_one = djt.med("enq", DJT_ONE, "jobs_per_s")

    def row(measure, x, pg, pr, dj, target="-", met="-", nd=0):
        return (
            f"| {measure} | {num(x, nd)} | {num(pg, nd)} | {num(pr, nd)} | {num(dj, nd)} "
            f"| {ratio(x, pg)} | {ratio(x, pr)} | {ratio(x, dj)} | {target} | {met} |"
        )

    met = judge(vo, pgq_one, 1.2, side.get("one-by-one"))
    rows.append(
        row(
            f"enqueue one-by-one, jobs/s (vpay: `noop.enqueue()`; pgqueuer: best of sync/async one-by-one = "
            f"{num(pgq_sync)} / {num(pgq_async)}; procrastinate: sync `defer()`; django-tasks-db: `task.enqueue()`)",
            vo,
            pgq_one,
            pro_one,
            djt_one,
            "≥ 1.2x pgqueuer",
            met,
        )
    )
    rows.append(side_row("one-by-one", side))
    vd = v.med("enq", "jobs.queue.enqueue() one-by-one (autocommit; no Tasks layer)", "jobs_per_s")
    rows.append(row("↳ diagnostic: `jobs.queue.enqueue()` one-by-one (no Tasks layer)", vd, pgq_one, pro_one, djt_one))
    vb = v.med("enq", VPAY_BULK, "jobs_per_s")
    pgq_b = pgq.med("enq", PGQ_BULK, "jobs_per_s")
    pro_b = pro.med("enq", PRO_BULK, "jobs_per_s")
    djt_b = djt.med("enq", DJT_ATOMIC, "jobs_per_s")
    met = judge(vb, pgq_b, 1.5, side.get("bulk"))
    rows.append(
        row(
            "enqueue bulk 10,000 in one call, jobs/s (`enqueue_many`; `Queries.enqueue(lists)`; "
            "`batch_defer_async`; django-tasks-db has no bulk API: `task.enqueue()` x10,000 in one `atomic()`)",
            vb,
            pgq_b,
            pro_b,
            djt_b,
            "≥ 1.5x pgqueuer",
            met,
        )
    )
    rows.append(side_row("bulk", side))
    vc = v.med("enq", "jobs.queue.enqueue_many() in chunks of 1,000", "jobs_per_s")
    rows.append(row("↳ `enqueue_many` in chunks of 1,000", vc, pgq_b, pro_b, djt_b))
    vx = v.med("enq", VPAY_BULK_DISTINCT, "jobs_per_s")
    rows.append(
        row(
            "↳ `enqueue_many` x10,000, a distinct payload dict per job (built in the timed region)",
            vx,
            pgq_b,
            pro_b,
            djt_b,
        )
    )
    pgq_d = pgq.med("drain", PGQ_DRAIN, "jobs_per_s_steady")
    pgq_di = pgq.med("drain", PGQ_DRAIN, "jobs_per_s_incl_startup")
    pro_d = pro.med("drain", PRO_DRAIN, "jobs_per_s_steady")
    pro_di = pro.med("drain", PRO_DRAIN, "jobs_per_s_incl_startup")
    djt_d = djt.med("drain", DJT_DRAIN, "jobs_per_s_steady")
    djt_di = djt.med("drain", DJT_DRAIN, "jobs_per_s_incl_startup")
    for variant in v.drain:
        d = v.med("drain", variant, "jobs_per_s_steady")
        di = v.med("drain", variant, "jobs_per_s_incl_startup")
        met = judge(d, pgq_d, 1.5, None)
        rows.append(
            row(
                f"drain 20,000, jobs/s steady — vpay `{variant}` vs pgqueuer `{PGQ_DRAIN}` vs procrastinate "
                f"`{PRO_DRAIN}` vs django-tasks-db `{DJT_DRAIN}`",
                d,
                pgq_d,
                pro_d,
                djt_d,
                "≥ 1.5x pgqueuer",
                met,
            )
        )
        rows.append(row("↳ same, jobs/s incl. worker start", di, pgq_di, pro_di, djt_di))
    pgq_l = pgq.best("lat", "p50_ms", lower=True)[0]
    pro_l = pro.best("lat", "p50_ms", lower=True)[0]
    djt_l = djt.best("lat", "p50_ms", lower=True)[0]
    for variant in v.lat:
        for key, label, target in (("p50_ms", "p50", 3.0), ("p95_ms", "p95", 6.0)):
            x = v.med("lat", variant, key)
            xa = v.med("lat", variant, "after_commit_" + key)
            pg = pgq.med("lat", pgq_l, key) if pgq_l else None
            pr = pro.med("lat", pro_l, key) if pro_l else None
            dj = djt.med("lat", djt_l, key) if djt_l else None
            met = "n/a" if x is None else ("MET" if x <= target else "not met")
            meta = "n/a" if xa is None else ("MET" if xa <= target else "not met")
            rows.append(
                row(
                    f"idle pickup {label} ms, enqueue-call start → handler start (peers' stamp) — `{variant}`",
                    x,
                    pg,
                    pr,
                    dj,
                    f"≤ {target:g} ms",
                    met,
                    nd=2,
                )
            )
            rows.append(
                f"| ↳ {label} ms, enqueue commit returned → handler start (the issue's stamp) "
                f"| {num(xa, 2)} | - | - | - | - | - | - | ≤ {target:g} ms | {meta} |"
            )
    head = (
        "| measure | vpay | pgqueuer | procrastinate | django-tasks-db | vpay / pgqueuer | vpay / procrastinate "
        "| vpay / django-tasks-db | target | met? |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(rows) + "\n"


def load_raw(path: Path) -> dict[tuple[str, int], list[float]]:
    """The peers' pgbench results (``raw_limit/raw.csv``): (mode, clients) -> jobs/s per rep."""
    by: dict[tuple[str, int], list[float]] = defaultdict(list)
    if path.exists():
        for r in csv.DictReader(path.open()):
            by[(r["mode"], int(r["clients"]))].append(float(r["jobs_per_s"]))
    return by


def raw_comparison(v: Lib, raw: dict) -> str:
    """vpay's figures as a share of what PostgreSQL itself does on this machine (pgbench, C client,
    prepared statements, no queue logic): how much is left to gain at all."""
    if not raw:
        return "(the raw limit was not run)\n"
    d1 = max(
        (v.med("drain", var, "jobs_per_s_steady") or 0 for var in v.drain if "--concurrency 1 " in var), default=None
    )
    pairs = (
        ("enqueue one-by-one (`noop.enqueue()`)", v.med("enq", VPAY_ONE, "jobs_per_s"), RAW_ONE),
        ("enqueue bulk (`enqueue_many` x10,000 in one transaction)", v.med("enq", VPAY_BULK, "jobs_per_s"), RAW_BULK),
        ("drain, `runworker --concurrency 1`, jobs/s steady", d1, RAW_DRAIN),
    )
    s = "| vpay measure | vpay | raw PostgreSQL limit | raw | vpay / raw |\n|---|---|---|---|---|\n"
    for label, x, (mode, clients, raw_label) in pairs:
        r = statistics.median(raw[(mode, clients)]) if raw.get((mode, clients)) else None
        s += f"| {label} | {num(x)} | {raw_label} | {num(r)} | {ratio(x, r)} |\n"
    return s


# The line above the report's own text. What a file being rewritten holds between its title and
# this line (or, in a file written before the line existed, the report's first words) is kept:
# the measurements sessions wrote there by hand, each with its own command.
GENERATED = "<!-- Everything below is written by bench/report.py (make bench); the sections above are kept. -->"
_FIRST_WORDS = "One run of `bench/run.sh`"


def kept_sections(path: Path) -> str:
    """The hand-written sections of the results file being rewritten ("" when there is none)."""
    if not path.exists():
        return ""
    text = path.read_text()
    body = text.split("\n", 1)[1].lstrip("\n") if text.startswith("# ") else text
    for marker in (GENERATED, _FIRST_WORDS):
        if marker in body:
            return body[: body.index(marker)]
    return ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vpay", default=str(HERE / "out" / "vpay.jsonl"))
    ap.add_argument("--peers-out", required=True)
    ap.add_argument("--facts", default=None)
    ap.add_argument("--explain", default=str(HERE / "out" / "claim_explain.md"))
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"))
    ap.add_argument("--rerun", default="make bench   # = bench/run.sh ; REPS=3 bench/run.sh for 3 repetitions")
    ap.add_argument("--started", default="")
    ap.add_argument("--finished", default="")
    a = ap.parse_args()
    peers = Path(a.peers_out)
    v, pgq, pro = Lib(load(Path(a.vpay))), Lib(load(peers / "pgqueuer.jsonl")), Lib(load(peers / "procrastinate.jsonl"))
    djt = Lib(load(peers / "django_tasks.jsonl"))
    raw = load_raw(peers / "raw_limit" / "raw.csv")
    side = load_side(Path(a.vpay).parent / "side_by_side.jsonl")
    facts = Path(a.facts).read_text() if a.facts and Path(a.facts).exists() else "(not recorded)"
    explain = Path(a.explain)
    ex = [r for r in v.recs if r["kind"] == "explain"]
    s = "# vpay benchmark results\n\n" + kept_sections(Path(a.out)) + GENERATED + "\n\n## The last `make bench` run\n\n"
    s += (
        f"One run of `bench/run.sh` ({a.started} → {a.finished} UTC): the peers (pgqueuer, procrastinate, "
        "django-tasks-db, and the raw PostgreSQL limit measured with pgbench, from "
        "`/work/shared/bench-peers`, unchanged) and vpay measured in the same session, one after the other, on the "
        "same PostgreSQL (127.0.0.1:5432) with the same method: enqueue of 10,000 no-op jobs, drain of 20,000 "
        "pre-enqueued no-op jobs by one worker process with completion counted in the database, idle pickup "
        "latency of 50 jobs 200 ms apart. Numbers are medians over the run's repetitions (one value when REPS=1). "
        "The machine is shared: the load average is recorded below and with every vpay record "
        "(`bench/out/vpay.jsonl`, `loadavg_after`).\n\n"
    )
    s += f"Rerun: `{a.rerun}`\n\n"
    s += "## vpay against the peers, and the issue's targets\n\n" + comparison(v, pgq, pro, djt, side) + "\n"
    s += "## vpay against the raw PostgreSQL limit (the peers' pgbench scripts, same server, same run)\n\n"
    s += raw_comparison(v, raw) + "\n"
    s += (
        "Notes on method:\n\n"
        "- vpay's drain runs `tests.tasks.noop` through the Tasks backend, i.e. every job also inserts its "
        "`processed_jobs` fence row in the task's transaction (what an application task costs in vpay); "
        "`completed, counted in DB` is the number of fence rows, and `jobs` must end with no `task` row and "
        "`dead_letters` empty.\n"
        "- vpay's drain completion is polled every 20 ms (the peers' harness polls every 100 ms; at pgqueuer's "
        "rate that is a ±3% granularity on its steady figure).\n"
        "- vpay's worker starts with a migration check and seeds the hourly `sweep_expired` singleton (it runs "
        'once during the drain); both are inside "incl. worker start".\n'
        "- Idle latency: vpay's handler stamps `time.time()` as its first statement, right after the claim (the "
        "task body runs first; its fence row is inserted with the job's delete after it). The peers' stamp is taken in the "
        "bench process just before the enqueue call; vpay reports that and a stamp taken right after the "
        "enqueue's commit returned. Both processes are on one host and read the same system clock.\n"
        "- pgqueuer's one-by-one comparator is the faster of its sync and async one-by-one figures.\n"
        "- The enqueue targets are judged on the interleaved turns (`bench/enqueue_side_by_side.py`, run last): "
        "each library's phase above is minutes from the other's, and on this shared machine a one-by-one rate "
        "(one durable commit per call) moves by about ±15% between phases, the size of the margin asked for. "
        "The turns run each harness's own code unchanged, alternating which goes first, with the same reset "
        "(truncate, VACUUM ANALYZE, CHECKPOINT) before each.\n"
        "- Bulk: as the peers' harness does (`[PAYLOAD] * n`), vpay's request list repeats one request; the "
        "distinct-payload row shows what 10,000 different payload dicts cost on top (mostly their allocation, "
        "inside the timed region).\n\n"
    )
    s += "## All figures\n\n" + lib_tables(v, "vpay") + lib_tables(pgq, "pgqueuer") + lib_tables(pro, "procrastinate")
    s += lib_tables(djt, "django-tasks-db")
    tables = peers / "tables.md"
    if tables.exists() and "Raw Postgres limit" in tables.read_text():
        text = tables.read_text()
        start = text.index("### Raw Postgres limit")
        end = text.find("\n### ", start + 1)
        s += (
            "#### raw PostgreSQL limit (the peers' `summarize.py`)\n\n"
            + text[start : end if end > 0 else None].split("\n", 1)[1].strip()
            + "\n\n"
        )
    if ex:
        s += "## CLAIM statement, EXPLAIN ANALYZE on a 20,000-row backlog\n\n"
        s += "Execution times (ms): " + json.dumps(ex[-1].get("execution_ms")) + f"; plans in `{explain.name}`"
        s += " (bench/out/).\n\n"
    s += (
        "Where the drain's time goes, and suggested optimizations: `bench/PROFILE.md` (hand-written from "
        "the batch loop since replaced by the capacity runner, docs/runner.md; it names the commit it profiled).\n\n"
    )
    s += "## Machine and PostgreSQL\n\n```\n" + facts.strip() + "\n```\n"
    Path(a.out).write_text(s)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
