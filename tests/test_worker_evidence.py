"""bench/worker_evidence.py: what a benchmark prints of its worker's log, and that a run
whose last settlement kept pace with the rest says nothing more."""

from __future__ import annotations

import datetime as dt
import json

from bench import worker_evidence


def test_the_logs_warnings_and_errors_are_counted_by_message_and_the_rest_ignored(tmp_path, capsys):
    log = tmp_path / "worker.log"
    lines = [
        {"level": "warning", "message": "backstop re-enqueued polls"},
        {"level": "info", "message": "charge succeeded"},
        {"level": "warning", "message": "backstop re-enqueued polls"},
        {"level": "error", "message": "job handler failed"},
    ]
    log.write_text("\n".join(json.dumps(line) for line in lines) + "\nnot json\n")
    worker_evidence.log_summary(log)
    err = capsys.readouterr().err
    assert "2 x warning: backstop re-enqueued polls" in err and "1 x error: job handler failed" in err
    assert "charge succeeded" not in err


def test_a_run_whose_last_settlement_kept_pace_reports_nothing(tmp_path, capsys):
    start = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
    rows = [(0.0, start, start + dt.timedelta(seconds=i * 0.01), f"ch_{i}") for i in range(200)]
    p99 = rows[int((len(rows) + 1) * 0.99) - 1][2]  # the 99th percentile once the last is in
    rows.append((0.0, start, p99 + dt.timedelta(seconds=worker_evidence.TAIL_SECONDS), "ch_last"))  # at the bound
    worker_evidence.report_tail(rows, "postgresql://nowhere.invalid/none", tmp_path / "worker.log")
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "worker_stalled.log").exists()
