"""Where the benchmarks run: the PostgreSQL server, the database names and the output folder.

By default the machine's PostgreSQL (127.0.0.1:5432, role root, trust auth: the server the
peers' harness measures on), databases named as each script says, results in ``bench/out``.
Three variables move every script elsewhere, which the smoke test
(``tests/test_bench_smoke.py``) uses to run each one for a second against the test server,
under names of its own, without touching ``bench/out``:

* ``VPAY_BENCH_SERVER``: a database URL with ``{db}`` where the database name goes;
* ``VPAY_BENCH_DB_PREFIX``: put before every database name (concurrent runs stay apart);
* ``VPAY_BENCH_OUT``: the output folder.
"""

from __future__ import annotations

import os
from pathlib import Path

SERVER = os.environ.get("VPAY_BENCH_SERVER", "postgresql://root@127.0.0.1:5432/{db}")
PREFIX = os.environ.get("VPAY_BENCH_DB_PREFIX", "")
OUT = Path(os.environ.get("VPAY_BENCH_OUT", str(Path(__file__).resolve().parent / "out")))


def name(db: str) -> str:
    """The database this run uses for a script's ``db``."""
    return PREFIX + db


def url(db: str) -> str:
    """The URL of database ``db`` (already named through :func:`name`, or ``postgres``)."""
    return SERVER.format(db=db)
