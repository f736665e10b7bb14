"""Django is set up with the cyclic collector paused and what setup built frozen
(vpay/startup_heap.py); the collector is on again afterwards, also when setup fails."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from vpay.startup_heap import startup_heap


@pytest.fixture
def collector():
    """The collector's state restored after the test (these tests freeze and toggle it)."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_the_collector_is_off_inside_and_on_after_with_the_survivors_frozen(collector):
    gc.enable()
    gc.unfreeze()
    with startup_heap():
        assert not gc.isenabled()
        built = [{"n": i} for i in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(built)


def test_a_setup_that_fails_leaves_the_collector_on(collector):
    gc.enable()
    with pytest.raises(RuntimeError), startup_heap():
        raise RuntimeError("setup failed")
    assert gc.isenabled()


def test_a_manage_py_command_runs_with_the_collector_on_and_setups_heap_frozen():
    # A real process through manage.py, as runworker and every command start.
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", "import gc; print('gc', gc.isenabled(), gc.get_freeze_count())"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("gc ")]
    _, enabled, frozen = line.split()
    assert enabled == "True"
    assert int(frozen) > 50_000, frozen  # Django, the apps and their libraries (about 110,000)
