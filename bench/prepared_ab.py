"""Does the one-by-one enqueue still need ``vpay/prepared.py``? The same enqueue with the
libpq prepared path on and off, in alternating turns in one process (ABBA), so the
machine's drift cancels out of the ratio.

  python bench/prepared_ab.py [--blocks 8] [--n 2000]

Uses ``bench/bench_vpay.py``'s database and its unchanged ``enqueue_tasks_one_by_one``
(``noop.enqueue()`` through the Tasks API, one durable commit each) and
``enqueue_queue_one_by_one`` (``jobs.adapters.postgres.enqueue``). ``VPAY_DB_PREPARED_STATEMENTS`` is
what turns the path off in production (behind a transaction-pooling PgBouncer); here it is
flipped on the live settings between turns. Writes ``bench/out/prepared_ab.jsonl``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_vpay  # noqa: E402  (sets DATABASE_URL and Django's settings for this process)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    bench_vpay.setup()
    from django.conf import settings

    paths = {"tasks": bench_vpay.enqueue_tasks_one_by_one, "queue": bench_vpay.enqueue_queue_one_by_one}
    rates: dict[tuple[str, bool], list[float]] = {(p, on): [] for p in paths for on in (True, False)}
    ratios: dict[str, list[float]] = {p: [] for p in paths}
    for block in range(args.blocks):
        order = (True, False) if block % 2 == 0 else (False, True)
        for path, run in paths.items():
            got = {}
            for on in order:
                settings.VPAY_DB_PREPARED_STATEMENTS = on
                got[on] = run(args.n)
                rates[(path, on)].append(got[on])
            ratios[path].append(got[True] / got[False])
            print(f"block {block} {path}: prepared {got[True]:,.0f}/s, plain {got[False]:,.0f}/s", flush=True)
    settings.VPAY_DB_PREPARED_STATEMENTS = True
    for path in paths:
        rec = {
            "bench": "prepared_ab",
            "path": path,
            "n": args.n,
            "blocks": args.blocks,
            "prepared_median": round(statistics.median(rates[(path, True)])),
            "plain_median": round(statistics.median(rates[(path, False)])),
            "ratio_median": round(statistics.median(ratios[path]), 3),
            "ratio_min": round(min(ratios[path]), 3),
            "ratio_max": round(max(ratios[path]), 3),
            "loadavg": bench_vpay.loadavg(),
        }
        bench_vpay.emit(rec)
        print(rec, flush=True)


if __name__ == "__main__":
    main()
