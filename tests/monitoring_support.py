"""What the monitoring tests read: the alert rules, the dashboard, the runbooks, and the
metric names their expressions use."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "ops" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "ops" / "prometheus" / "alerts.test.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "vpay.json"
RUNBOOKS = ROOT / "docs" / "runbooks"

# Series Prometheus makes itself, not an exporter.
PROMETHEUS_OWN = {"up"}
_METRIC = re.compile(r"\b(vpay_[a-zA-Z0-9_]+|up)\b(?!\s*\()")
_FIRST_QUERY = re.compile(r"^## First query\s*\n(?:(?!^## ).)*?```sql\n(.*?)```", re.S | re.M)


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (vpay's, and Prometheus's own ``up``);
    label names and values are never matched (they sit inside braces, stripped first)."""
    without_matchers = re.sub(r"\{[^}]*\}", "", expr)
    without_grouping = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_matchers)
    return set(_METRIC.findall(without_grouping))


def runbook_pages() -> list[Path]:
    return sorted(p for p in RUNBOOKS.glob("*.md") if p.name != "README.md")


def first_query(page: Path) -> str:
    """The SQL block under a runbook's "## First query" heading."""
    match = _FIRST_QUERY.search(page.read_text())
    assert match, f"{page.name} has no ```sql block under '## First query'"
    return match.group(1).strip().rstrip(";")


def exported_names(exposition: str) -> set[str]:
    """Every series name a /metrics text declares, labelled children or not: a labelled
    metric nobody has incremented yet still has its ``# TYPE`` line. A histogram's
    ``_bucket``/``_sum``/``_count`` and a counter's ``_total`` are the names queries use."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            if kind == "counter" and not name.endswith("_total"):
                names.add(f"{name}_total")
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names
