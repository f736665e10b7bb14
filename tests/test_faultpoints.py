"""The kill points are inert in shipping code: ``vpay.faultpoints.reached`` does nothing
without a callback, nothing shipped installs one or reads the variable, and the test
module that does refuses live mode."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fault_injection
from tests.killpoints_support import kill_env
from vpay import faultpoints

ROOT = Path(__file__).resolve().parent.parent
SHIPPING = ["api", "charges", "customers", "jobs", "merchants", "vpay", "webhooks", "sandbox", "manage.py"]


def shipped_sources() -> list[Path]:
    files = []
    for name in SHIPPING:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def test_reached_is_a_no_op_without_a_callback():
    assert faultpoints._callback is None  # nothing in this (test) process installed one
    for point in faultpoints.POINTS:
        assert faultpoints.reached(point, "anything") is None


def test_nothing_shipped_installs_a_callback_reads_the_variable_or_imports_the_tests():
    for path in shipped_sources():
        text = path.read_text()
        assert fault_injection.ENV not in text, path
        assert not re.search(r"^\s*(from|import) tests\b", text, re.M), path
        if path.name != "faultpoints.py":
            assert "faultpoints.install" not in text, path
    hook = (ROOT / "vpay" / "faultpoints.py").read_text()
    assert not re.search(r"^\s*(from|import) ", hook.split("from collections.abc import Callable")[1], re.M)
    assert "os." not in hook and "getenv" not in hook  # it reads nothing from outside


def test_every_point_is_called_exactly_once_in_shipping_code_and_rehearsed():
    from tests.test_killpoints import FAST_CASES

    calls = re.compile(r'faultpoints\.reached\("([a-z_.]+)"')
    found = [name for path in shipped_sources() for name in calls.findall(path.read_text())]
    assert sorted(found) == sorted(faultpoints.POINTS)
    assert {case.split("@")[0].split(":")[0] for case in FAST_CASES} == set(faultpoints.POINTS)


def _probe(env: dict[str, str]) -> subprocess.CompletedProcess:
    """A Python process started as a rehearsal's worker is (its sitecustomize), printing
    whether a callback got installed."""
    return subprocess.run(
        [sys.executable, "-c", "from vpay import faultpoints; print(faultpoints._callback is not None)"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_test_module_arms_a_worker_outside_live_mode(tmp_path):
    got = _probe(kill_env(tmp_path, "job.claimed:3"))
    assert got.stdout.strip() == "True", got.stderr


@pytest.mark.parametrize("value", ["true", "1", "yes", "on"])
def test_the_test_module_refuses_live_mode_and_arms_nothing(tmp_path, value):
    got = _probe({**kill_env(tmp_path, "job.claimed:3"), "VPAY_LIVE_MODE": value})
    assert got.stdout.strip() == "False"
    assert "FaultInjectionRefused" in got.stderr or "sitecustomize" in got.stderr
    direct = subprocess.run(
        [sys.executable, "-c", "import tests.fault_injection"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "VPAY_LIVE_MODE": value},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert direct.returncode != 0 and "FaultInjectionRefused" in direct.stderr


def test_the_callback_looks_at_the_settings_again_before_it_kills(settings):
    settings.LIVE_MODE = True
    callback = fault_injection.killer("job.claimed", None, 1)
    with pytest.raises(fault_injection.FaultInjectionRefused):
        callback("job.claimed", "poll_charge")  # would have killed this very process


@pytest.mark.parametrize(
    "spec, parsed",
    [
        ("job.claimed", ("job.claimed", None, 1)),
        ("job.claimed@poll_charge", ("job.claimed", "poll_charge", 1)),
        ("rail.answered@status:4", ("rail.answered", "status", 4)),
        ("fan_out.event_committed:2", ("fan_out.event_committed", None, 2)),
    ],
)
def test_a_kill_spec_is_parsed(spec, parsed):
    assert fault_injection.parse(spec) == parsed


@pytest.mark.parametrize("spec", ["job.claimd", "job.claimed:0", "job.claimed:x", ""])
def test_a_malformed_kill_spec_is_refused(spec):
    with pytest.raises(ValueError):
        fault_injection.parse(spec)
