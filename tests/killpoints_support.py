"""The environment that loads ``tests/fault_injection.py`` into a worker subprocess: a
``sitecustomize`` of the test's own (the mechanism of ``tests/clock_support.py``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SITECUSTOMIZE = "# Loaded only by a rehearsal's worker subprocess (its PYTHONPATH).\nimport tests.fault_injection\n"


def kill_env(tmp_path: Path, spec: str | None) -> dict[str, str]:
    """Environment for a worker that SIGKILLs itself at ``spec`` (``point[@subject][:nth]``);
    ``spec=None`` loads the module with nothing to do."""
    site = tmp_path / "fault-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {"PYTHONPATH": f"{site}:{ROOT}"}
    env["VPAY_TEST_KILL_AT"] = spec or ""
    return env
