"""The operator's imports: ``ops/prometheus/alerts.yml`` checked and unit-tested by
Debian's ``promtool`` (installed by tests/ops/install-prometheus.sh when missing), every
rule naming a runbook that exists, and ``ops/grafana/vpay.json`` a dashboard Grafana can
import with the Prometheus datasource as a variable."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.monitoring_support import (
    DASHBOARD,
    ROOT,
    RULE_TESTS,
    RULES,
    RUNBOOKS,
    dashboard,
    dashboard_exprs,
    dashboard_panels,
    metric_names,
    rules,
    runbook_pages,
)

INSTALL = ROOT / "tests" / "ops" / "install-prometheus.sh"


@pytest.fixture(scope="module")
def promtool() -> str:
    if not shutil.which("promtool"):
        subprocess.run(["sh", str(INSTALL)], check=False, timeout=900)
    path = shutil.which("promtool")
    if not path:
        pytest.skip("promtool is missing and could not be installed (needs root and apt-get: Debian's prometheus)")
    return path


def test_promtool_accepts_the_rules(promtool):
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_the_rules_unit_tests_pass(promtool):
    result = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=60, cwd=RULE_TESTS.parent
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rule_is_named_once_has_a_severity_and_a_runbook_that_exists():
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names))
    for rule in rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        runbook = rule["annotations"]["runbook"]
        assert runbook.startswith("docs/runbooks/") and (ROOT / runbook).is_file(), (rule["alert"], runbook)
        # The page is titled with the alert it is for.
        assert (ROOT / runbook).read_text().startswith(f"# {rule['alert']}\n"), runbook


def test_every_runbook_page_belongs_to_a_rule_and_is_listed_in_the_index():
    named = {rule["annotations"]["runbook"] for rule in rules()}
    index = (RUNBOOKS / "README.md").read_text()
    for page in runbook_pages():
        assert f"docs/runbooks/{page.name}" in named, f"{page.name} is no rule's runbook"
        assert f"]({page.name})" in index, f"{page.name} is missing from docs/runbooks/README.md"


DATABASE_GAUGES = (
    "vpay_workers_live",
    "vpay_dead_letters_pending",
    "vpay_dead_letters_pending_oldest_job_age_seconds",
    "vpay_processed_jobs_ttl_seconds",
    "vpay_fenced_live_jobs",
    "vpay_fenced_live_jobs_min_ttl_left_seconds",
    "vpay_charges_live",
    "vpay_webhook_deliveries_failed_24h",
    "vpay_webhook_deliveries_pending",
    "vpay_webhook_events_abandoned_pending",
    "vpay_webhook_events_pending_fan_out",
    "vpay_webhook_events_pending_fan_out_oldest_age_seconds",
    "vpay_jobs_oldest_claimable_age_seconds",
    "vpay_jobs_queue_depth",
    "vpay_breaker_state",
    "vpay_breakers",
    "vpay_table_bytes",
    "vpay_table_rows_estimate",
)


@pytest.mark.parametrize("where", ["rules", "dashboard"])
def test_every_gauge_read_from_the_database_is_taken_with_max_or_min_never_summed_across_targets(where):
    # Every worker and the web process report the same database: a gauge read from it,
    # summed across targets, would count it once per target.
    exprs = [r["expr"] for r in rules()] if where == "rules" else dashboard_exprs()
    for expr in exprs:
        for name in metric_names(expr) & set(DATABASE_GAUGES):
            uses = re.findall(rf"\b{name}\b(?!_)", expr)
            wrapped = re.findall(rf"\b(?:max|min)(?:\s+by\s*\([^)]*\))?\s*\(\s*{name}\b(?!_)", expr)
            assert len(uses) == len(wrapped), f"{name} not under max/min in: {expr}"


def test_the_dashboard_is_importable_with_the_datasource_as_a_variable():
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 30
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard_panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}" and target["expr"], panel["title"]


def test_the_dashboard_covers_what_an_operator_watches():
    exprs = " ".join(t["expr"] for p in dashboard_panels() for t in p["targets"])
    for needed in (
        'vpay_jobs_queue_depth{state="claimable"}',  # queue depth by kind
        "vpay_jobs_oldest_claimable_age_seconds",  # and age
        "sum by (disposition) (rate(vpay_jobs_total",  # throughput by disposition
        "vpay_webhook_deliveries_finished_total",  # deliveries by outcome
        "vpay_webhook_attempt_duration_seconds_bucket",  # and latency
        "vpay_charges_live",  # charges by state
        "vpay_breaker_state",  # breaker states
        "vpay_workers_live",  # worker count
    ):
        assert needed in exprs, needed


def test_the_dashboard_expressions_parse(promtool, tmp_path):
    # promtool has no expression checker of its own: each panel's query becomes a
    # recording rule, which `check rules` parses ($__rate_interval stands in as 5m).
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, panel in enumerate(dashboard_panels()):
        for j, target in enumerate(panel["targets"]):
            expr = target["expr"].replace("$__rate_interval", "5m").replace("$worker_job", "vpay-worker")
            lines += [f"      - record: dashboard:panel{i}:target{j}", f"        expr: {expr!r}"]
    rules_file = tmp_path / "dashboard.yml"
    rules_file.write_text("\n".join(lines) + "\n")
    result = subprocess.run([promtool, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert DASHBOARD.is_file()


# Alerts a rule on a gauge covers (the condition is still true in the database) rather than
# a rule on the alert counter (vpay_alert_events_total{category=<source>}).
COVERED_BY_A_GAUGE = {
    "charges.unresolved": "VpayChargesUnresolved",
    "webhooks.delivery_exhausted": "VpayWebhookDeliveriesExhausted",
    "webhooks.delivery_refused": "VpayWebhookDeliveriesRefused",
    "webhooks.event_abandoned": "VpayWebhookEventsAbandoned",
}
# Sources the code composes rather than spells (capture_transitions.escalate).
COMPOSED_SOURCES = {"charges.capture_unresolved", "charges.void_unresolved"}
APPS = ("charges", "jobs", "webhooks", "customers", "merchants", "api", "vpay")


def _raised_sources() -> set[str]:
    sources = set(COMPOSED_SOURCES)
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            text = path.read_text()
            sources.update(re.findall(r'\bsource="([a-z_]+\.[a-z_.]+)"', text))
            if path.name == "capture_transitions.py":  # _alert(row, "<kind>", ...): source charges.<kind>
                sources.update(f"charges.{kind}" for kind in re.findall(r'_alert\(\s*row,\s*"([a-z_]+)"', text))
    return sources


def _category_matchers() -> dict[str, str]:
    """Each counter rule's category matcher, as a Python regex: rule name by pattern."""
    matchers = {}
    for rule in rules():
        for op, value in re.findall(r'category(=~|=)"([^"]*)"', rule["expr"]):
            # PromQL unescapes a string's backslashes once before it is a regex.
            matchers[value.replace("\\\\", "\\") if op == "=~" else re.escape(value)] = rule["alert"]
    return matchers


def test_every_alert_the_code_raises_has_a_rule_that_pages_on_it():
    """jobs.operator.alerts lines are left out of VpayAlertLogLine, so an alert source no rule
    names would reach the alerts table and the alert webhook, and never Prometheus."""
    sources = _raised_sources()
    assert {"charges.void_refused", "charges.late_success", "webhooks.endpoint_disabled"} <= sources
    matchers = _category_matchers()
    names = {rule["alert"] for rule in rules()}
    for source in sorted(sources):
        if source in COVERED_BY_A_GAUGE:
            assert COVERED_BY_A_GAUGE[source] in names, source
            continue
        assert any(re.fullmatch(pattern, source) for pattern in matchers), f"no alert rule pages on {source!r}"


def test_every_alert_category_is_exported_at_zero_before_its_first_alert():
    """increase() sees nothing of a counter series until it has two samples: a category first
    exported with its first alert would not page on that alert (a late success may be the
    only one). Each category a rule or the code names is in vpay.metrics.ALERT_CATEGORIES,
    which every process exports at 0 from its start."""
    from prometheus_client import generate_latest

    from vpay.metrics import ALERT_CATEGORIES

    assert _raised_sources() <= set(ALERT_CATEGORIES)
    for rule in rules():
        for category in re.findall(r'category="([^"]*)"', rule["expr"]):
            assert category in ALERT_CATEGORIES, (rule["alert"], category)
    exported = generate_latest().decode()  # at 0 unless a test before this one raised it
    for category in ALERT_CATEGORIES:
        assert f'vpay_alert_events_total{{category="{category}",severity="page"}} ' in exported, category
