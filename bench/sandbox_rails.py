"""The rails file that points vpay at a sandbox rail (``python -m sandbox.rail``) listening
on a loopback port, for the benchmarks that start one."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path


def sandbox_rails_file(port: int) -> Path:
    """A fresh ``VPAY_RAILS_FILE`` with one push rail, ``sandbox_push``, at ``port``."""
    path = Path(tempfile.mkdtemp()) / "rails.json"
    path.write_text(
        json.dumps(
            {
                "sandbox_push": {
                    "base_url": f"http://127.0.0.1:{port}/push",
                    "flow": "push",
                    "api_key": "sandbox-rail-key",
                }
            }
        )
    )
    return path
