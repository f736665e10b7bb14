"""A host whose wall clock is off, for subprocesses: the vpay rule under test is that the
database clock schedules, so a skewed host must change nothing it decides."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

SKEWED_SITECUSTOMIZE = textwrap.dedent(
    """
    # Loaded only by a skewed subprocess (its PYTHONPATH): the host clock is off.
    import datetime as _dt
    import os as _os
    import time as _time

    _offset = float(_os.environ["VPAY_TEST_CLOCK_OFFSET"])
    _real_time, _real_time_ns = _time.time, _time.time_ns
    _time.time = lambda: _real_time() + _offset
    _time.time_ns = lambda: _real_time_ns() + int(_offset * 1e9)


    class _SkewedDatetime(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return super().now(tz) + _dt.timedelta(seconds=_offset)

        @classmethod
        def utcnow(cls):
            return super().utcnow() + _dt.timedelta(seconds=_offset)

        @classmethod
        def today(cls):
            return cls.now()


    _dt.datetime = _SkewedDatetime
    """
)


def libfaketime() -> str | None:
    for pattern in (
        "/usr/lib/*/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ):
        for path in sorted(Path("/").glob(pattern.lstrip("/"))):
            return str(path)
    return None


def skewed_env(mechanism: str, offset_seconds: int, tmp_path: Path) -> dict[str, str]:
    """Environment that runs a worker subprocess with its wall clock ``offset_seconds`` off."""
    if mechanism == "libfaketime":
        library = libfaketime()
        if library is None:
            pytest.skip(f"libfaketime is not installed (faketime binary: {shutil.which('faketime')})")
        # Wall clock only: a real skewed host's monotonic clock is unaffected as well.
        return {
            "LD_PRELOAD": library,
            "FAKETIME": f"{offset_seconds:+d}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
    site = tmp_path / f"skew{offset_seconds:+d}"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SKEWED_SITECUSTOMIZE)
    return {"PYTHONPATH": str(site), "VPAY_TEST_CLOCK_OFFSET": str(offset_seconds)}
