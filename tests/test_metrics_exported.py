"""Every metric an alert rule or a dashboard panel reads is exported: by a real
``runworker --metrics-port`` process, scraped over HTTP, or by the web process's
``/metrics`` (behind ``VPAY_METRICS_TOKEN``). A rule over a name nobody exports never fires."""

from __future__ import annotations

import logging
import signal
import socket
import urllib.request

import pytest

from tests.conftest import wait_for
from tests.monitoring_support import PROMETHEUS_OWN, dashboard_exprs, exported_names, metric_names, rules
from vpay import metrics

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "scrape-t0ken-for-the-monitoring-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape_worker(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def referenced() -> dict[str, set[str]]:
    """Metric name -> where it is read (rule names, "dashboard")."""
    where: dict[str, set[str]] = {}
    for rule in rules():
        for name in metric_names(rule["expr"]):
            where.setdefault(name, set()).add(rule["alert"])
    for expr in dashboard_exprs():
        for name in metric_names(expr):
            where.setdefault(name, set()).add("dashboard")
    return where


def test_the_rules_and_panels_read_only_metrics_a_worker_or_the_web_process_exports(start_worker, client, settings):
    port = free_port()
    worker = start_worker("--concurrency", "2", "--metrics-port", str(port))
    # The worker's gauges (read from the database) are set by its first maintenance tick.
    worker_text = wait_for(
        lambda: (text := _try_scrape(worker, port)) and "\nvpay_workers_live " in text and text,
        timeout=60,
        message="the worker's metrics with its database gauges",
    )

    settings.VPAY_METRICS_TOKEN = TOKEN
    metrics.WORKERS_LIVE.set(-1)  # whatever an earlier test left: the scrape must read it afresh
    logging.getLogger("tests.monitoring").warning("a line a human must see", extra={"alert": True})
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    web_text = response.content.decode()

    worker_names, web_names = exported_names(worker_text), exported_names(web_text)
    missing = {
        name: sorted(users)
        for name, users in referenced().items()
        if name not in PROMETHEUS_OWN and name not in worker_names | web_names
    }
    assert not missing, f"read by a rule or panel but exported by neither process: {missing}"

    # What must work with no worker left (VpayNoWorkers, the backlog rules) is on the web
    # process too; per-process counters are the worker's.
    for name in ("vpay_workers_live", "vpay_dead_letters_pending", "vpay_jobs_oldest_claimable_age_seconds"):
        assert name in web_names and name in worker_names, name
    assert "vpay_jobs_total" in worker_names
    # The web process read the database at the scrape: the running worker is counted.
    assert "\nvpay_workers_live 1.0\n" in web_text
    # The counted alert line, from the web process's own logging.
    assert 'vpay_alert_log_lines_total{level="WARNING",logger="tests.monitoring"}' in web_text

    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()[-3000:]


def _try_scrape(worker, port: int) -> str:
    assert worker.proc.poll() is None, f"worker exited early:\n{worker.output()[-3000:]}"
    try:
        return scrape_worker(port)
    except OSError:
        return ""
