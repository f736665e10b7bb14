"""Enqueue, vpay against pgqueuer, in alternating turns: the ratio with the machine's drift taken out.

  python bench/enqueue_side_by_side.py [--blocks 8] [--n-one 2000] [--n-bulk 10000]

``bench/run.sh`` measures each library in its own phase, minutes apart; on this shared
2-core machine a one-by-one enqueue rate moves by ±15% between phases (a durable commit per
call: the fsync and the scheduler decide), which is the size of the margin the targets ask
for. Here the two run in turns, ``--blocks`` times, alternating which goes first (ABBA), each
turn measured with its own harness's unchanged code: pgqueuer's ``enqueue_async`` from the
peers' ``pgqueuer/bench.py`` (in the peers' venv, a fresh process per turn), vpay's
``enqueue_tasks_one_by_one`` / ``enqueue_bulk`` from ``bench/bench_vpay.py``. Both reset and
settle their tables (truncate, VACUUM ANALYZE, CHECKPOINT) before every turn, as in the
run. Reported: each side's median, and the median and range of the per-block ratios.

Needs the databases and the peers' venv that ``bench/run.sh`` leaves behind (PEERS_DIR,
default ``${TMPDIR:-/tmp}/vpay-bench-peers``). Writes ``bench/out/side_by_side.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_vpay  # noqa: E402  (sets DATABASE_URL and Django's settings for this process)

PEERS_DIR = Path(os.environ.get("PEERS_DIR", Path(os.environ.get("TMPDIR", "/tmp")) / "vpay-bench-peers"))
PGQ_TURN = """
import json, sys
sys.argv = ["bench.py"]
sys.path.insert(0, {bench_dir!r})
import bench
print(json.dumps(bench.enqueue_async({n}, {bulk})))
"""


def pgqueuer_turn(n: int, bulk: bool) -> float:
    code = PGQ_TURN.format(bench_dir=str(PEERS_DIR / "pgqueuer"), n=n, bulk=bulk)
    out = subprocess.run(
        [str(PEERS_DIR / ".venv/bin/python"), "-c", code],
        cwd=PEERS_DIR / "pgqueuer",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.strip().splitlines()[-1])


def vpay_turn(n: int, bulk: bool) -> float:
    return bench_vpay.enqueue_bulk(n, n) if bulk else bench_vpay.enqueue_tasks_one_by_one(n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--n-one", type=int, default=2000)
    ap.add_argument("--n-bulk", type=int, default=10000)
    a = ap.parse_args()
    if not (PEERS_DIR / ".venv/bin/python").exists():
        sys.exit(f"no peers' venv at {PEERS_DIR}: run bench/run.sh first (or set PEERS_DIR)")
    bench_vpay.setup(fresh=False)
    out = Path(os.environ.get("VPAY_BENCH_OUT", str(HERE / "out"))) / "side_by_side.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {}
    for measure, n, bulk in (("one-by-one", a.n_one, False), ("bulk", a.n_bulk, True)):
        pairs = []
        for block in range(a.blocks):
            turns = (("pgqueuer", pgqueuer_turn), ("vpay", vpay_turn))
            if block % 2:
                turns = turns[::-1]
            rates = {name: turn(n, bulk) for name, turn in turns}
            pairs.append(rates)
            with out.open("a") as f:
                record = {"ts": time.time(), "measure": measure, "n": n, "block": block, **rates}
                f.write(json.dumps({**record, "loadavg_after": Path("/proc/loadavg").read_text().strip()}) + "\n")
            print(
                f"{measure} block {block}: vpay {rates['vpay']:,.0f}/s, pgqueuer {rates['pgqueuer']:,.0f}/s", flush=True
            )
        ratios = [p["vpay"] / p["pgqueuer"] for p in pairs]
        summary[measure] = {
            "vpay": statistics.median(p["vpay"] for p in pairs),
            "pgqueuer": statistics.median(p["pgqueuer"] for p in pairs),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "blocks": a.blocks,
        }
    with out.open("a") as f:
        f.write(json.dumps({"ts": time.time(), "summary": summary}) + "\n")
    for measure, s in summary.items():
        print(
            f"{measure}: vpay {s['vpay']:,.0f}/s, pgqueuer {s['pgqueuer']:,.0f}/s; per-block ratio median "
            f"{s['ratio_median']:.2f}x [{s['ratio_min']:.2f}-{s['ratio_max']:.2f}] over {s['blocks']} blocks"
        )


if __name__ == "__main__":
    main()
