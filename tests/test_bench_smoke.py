"""Every benchmark script runs end to end with tiny sizes, so none can rot unnoticed (it did:
``bench_vpay.py``'s explain phase once failed on a local variable named like a module).

Nothing here is timed or compared: each script runs as ``make bench`` runs it (a real
process, its own database made and migrated), pointed by ``bench/target.py``'s variables at
the test server under names of this run's own and at a scratch output folder. The scripts
that need the peers' harness (pgqueuer) or tools the machine may lack skip, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.conftest import ROOT, database_url


def server_template() -> str:
    """The test server's URL with ``{db}`` in place of the database name."""
    return urlunsplit(urlsplit(database_url())._replace(path="/{db}"))


@pytest.fixture(scope="module")
def bench_env(tmp_path_factory):
    """The environment every script runs in; its databases are dropped at the end."""
    prefix = f"smoke_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{os.getpid()}_"
    out = tmp_path_factory.mktemp("bench-out")
    env = {
        **os.environ,
        "VPAY_BENCH_SERVER": server_template(),
        "VPAY_BENCH_DB_PREFIX": prefix,
        "VPAY_BENCH_OUT": str(out),
        "VPAY_LOG_LEVEL": "WARNING",
    }
    yield env
    with psycopg.connect(server_template().format(db="postgres"), autocommit=True) as conn:
        names = conn.execute("SELECT datname FROM pg_database WHERE starts_with(datname, %s)", [prefix]).fetchall()
        for (name,) in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(env: dict, script: str, *args: str, timeout: float = 240) -> str:
    result = subprocess.run(
        [sys.executable, f"bench/{script}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result.stdout


# The tests that read bench_vpay's database go to one xdist worker, which runs it once;
# spread over several, each would run it again (a module fixture is per worker).
on_bench_vpays_database = pytest.mark.xdist_group("bench_vpay_database")


@pytest.fixture(scope="module")
def bench_vpay_ran(bench_env):
    """``bench_vpay.py`` once, every phase (it makes the database the profilers read)."""
    run(
        bench_env, "bench_vpay.py",
        "--n-enq", "20", "--n-drain", "40", "--n-lat", "2", "--concurrency", "2", "--lat-concurrency", "1",
        "--lat-idle", "0.5", "--poll", "0.05",
    )  # fmt: skip
    return Path(bench_env["VPAY_BENCH_OUT"])


@on_bench_vpays_database
def test_bench_vpay_runs_every_phase_and_writes_its_tables(bench_vpay_ran):
    records = [json.loads(line) for line in (bench_vpay_ran / "vpay.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in records}
    assert kinds == {"versions", "enqueue", "drain", "latency", "explain"}, kinds
    assert all(r["ok"] for r in records if r["kind"] in ("drain", "latency")), records
    assert (bench_vpay_ran / "vpay_tables.md").read_text().strip()
    assert "Execution Time" in (bench_vpay_ran / "claim_explain.md").read_text()
    (explain,) = [r for r in records if r["kind"] == "explain"]
    assert {"claim_fresh", "finish_many", "fence_and_finish"} <= set(explain["execution_ms"]), explain


@on_bench_vpays_database
def test_the_report_is_written_from_bench_vpays_output(bench_env, bench_vpay_ran, tmp_path):
    peers = tmp_path / "peers"
    peers.mkdir()
    results = tmp_path / "RESULTS.md"
    run(
        bench_env, "report.py", "--vpay", str(bench_vpay_ran / "vpay.jsonl"), "--peers-out", str(peers),
        "--explain", str(bench_vpay_ran / "claim_explain.md"), "--out", str(results),
    )  # fmt: skip
    assert results.read_text().strip()


@on_bench_vpays_database
def test_the_report_keeps_the_hand_written_sections_of_the_file_it_rewrites(bench_env, bench_vpay_ran, tmp_path):
    peers = tmp_path / "peers"
    peers.mkdir()
    results = tmp_path / "RESULTS.md"
    # A file as sessions leave it: measured sections by hand above the last report's text.
    results.write_text(
        "# vpay benchmark results\n\n## Cost per job, by hand\n\n| a | b |\n\n"
        "One run of `bench/run.sh` (an older report)\n\n## All figures\n\nold\n"
    )
    args = ["--vpay", str(bench_vpay_ran / "vpay.jsonl"), "--peers-out", str(peers), "--out", str(results)]
    args += ["--explain", str(bench_vpay_ran / "claim_explain.md")]
    kept = []
    for _ in range(2):  # and again, over a file the report wrote itself: nothing doubles
        run(bench_env, "report.py", *args)
        text = results.read_text()
        assert text.count("## Cost per job, by hand\n\n| a | b |") == 1, text[:500]
        assert text.index("## Cost per job, by hand") < text.index("One run of `bench/run.sh`")
        assert "an older report" not in text and "\nold\n" not in text
        kept.append(text[: text.index("One run of `bench/run.sh`")])
    assert kept[0] == kept[1]


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("profile_claim.py", ["--n", "5", "--backlog", "20"]),
        ("profile_enqueue.py", ["--blocks", "1", "--calls", "5"]),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
@on_bench_vpays_database
def test_the_scripts_on_bench_vpays_database_run(bench_env, bench_vpay_ran, script, args):
    run(bench_env, script, *args)


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("bench_alerts.py", ["--jobs", "10", "--concurrency", "2"]),
        # These two make bench_vpay's database themselves (bench_vpay.setup()).
        ("prepared_ab.py", ["--blocks", "1", "--n", "5"]),
        ("soak.py", ["--minutes", "0.02", "--rate", "20", "--concurrency", "2", "--delayed", "50"]),
        ("bench_charges.py", ["--concurrency", "2", "--charges", "3", "--confirmers", "2"]),
        ("bench_charges.py", ["--statements", "2"]),
        ("drain_ab.py", ["--ref", "HEAD", "--ref", "WORKTREE", "--n", "20", "--reps", "1", "--concurrency", "2"]),
        (
            "bench_webhooks.py",
            [
                "--receiver",
                "sandbox",
                "--concurrency",
                "2",
                "--events",
                "3",
                "--endpoints",
                "2",
                "--latency-events",
                "2",
            ],
        ),
    ],
    ids=[
        "bench_alerts",
        "prepared_ab",
        "soak",
        "bench_charges",
        "bench_charges-statements",
        "drain_ab",
        "bench_webhooks",
    ],
)
def test_the_scripts_with_databases_of_their_own_run(bench_env, script, args):
    run(bench_env, script, *args)


NGINX = "nginx is not installed (apt-get install nginx-light): these scripts' receiver is nginx, by design"


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("bench_api_e2e.py", ["--payments", "3", "--clients", "2", "--concurrency", "2", "--workers", "1", "--no-limits", "--rate", "50"]),
        ("statements_webhooks.py", ["--deliveries", "2"]),
        ("bench_webhook_at_cap.py", ["--events", "3", "--delay", "0.1", "--cap", "1", "--concurrency", "2", "--seconds", "1"]),
    ],
    ids=["bench_api_e2e", "statements_webhooks", "bench_webhook_at_cap"],
)  # fmt: skip
def test_the_scripts_that_deliver_to_nginx_run(bench_env, script, args):
    if shutil.which("nginx") is None:
        pytest.skip(NGINX)
    run(bench_env, script, *args)


def test_top_statements_reads_pg_stat_statements_or_says_it_is_not_preloaded(bench_env):
    # The test server does not preload the extension; the benchmarks' server may.
    result = subprocess.run(
        [sys.executable, "bench/top_statements.py", "--db", "bench_charges", "--top", "3"],
        cwd=ROOT,
        env=bench_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode == 2:
        assert "pg_stat_statements is not usable on this server" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert "| calls | plans |" in result.stdout


def test_collapsed_stacks_reads_a_py_spy_file(bench_env, tmp_path):
    stacks = tmp_path / "stacks.txt"
    stacks.write_text("main (a.py:1);work (b.py:2) 3\nmain (a.py:1);idle (c.py:9) 1\n")
    assert "work" in run(bench_env, "collapsed_stacks.py", str(stacks))


@pytest.mark.parametrize(
    "script",
    ["enqueue_side_by_side.py", "peer_pgqueuer_mixed.py", "bench_runner.py"],
)
def test_the_scripts_that_run_pgqueuer_are_left_to_make_bench(script):
    pytest.skip(
        f"{script} runs pgqueuer from the peers' harness venv (bench/run.sh builds it from the shared"
        " bench-peers folder), which a test run does not have; make bench runs it"
    )
