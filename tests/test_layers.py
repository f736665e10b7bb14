"""Services know nothing of HTTP: they raise the domain errors of ``vpay/errors.py`` and only
``api/`` (and the views it routes) maps them to a status. So no module outside ``api/`` and
the views imports ``api``'s HTTP layer; the shared ids live in ``vpay/ids.py``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("charges", "customers", "merchants", "webhooks", "jobs")
HTTP_LAYER = ("api.framework", "api.errors", "api.params", "api.operations", "api.schemas", "api.oauth")


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_service_imports_the_http_layer():
    offenders = []
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "migrations" in rel.parts or path.name.endswith("views.py"):
                continue
            if hits := sorted(m for m in imported(path) if m.startswith(HTTP_LAYER)):
                offenders.append(f"{rel}: {', '.join(hits)}")
    assert offenders == []
