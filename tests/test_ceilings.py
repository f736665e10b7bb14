"""Every ceiling readable in one place: ``runworker --print-config``, the ``worker started``
line and the ``vpay_ceiling`` gauges, each value with where it came from."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from prometheus_client import REGISTRY

from jobs.primitives import ceilings
from jobs.runner.worker import Worker
from tests.test_worker_process import free_port, log_records, scrape, wait_exit, wait_started

# What the issue names: concurrency, prefetch, queues, per-tenant, per-rail, per-endpoint,
# deferral, breaker thresholds, recovery caps, retry policies, heartbeat/lease, timeouts, grace.
NAMED = [
    "worker.concurrency",
    "worker.prefetch",
    "worker.queues",
    "claim.max_tenants_per_claim",
    "worker.heartbeat_seconds",
    "worker.lease_seconds",
    "worker.grace_seconds",
    "rail.max_in_flight",
    "rail.worker_share",
    "rail.breaker_failures",
    "rail.breaker_cool_down_seconds",
    "recovery.not_found_streak",
    "recovery.horizon_seconds",
    "webhook.endpoint_max_in_flight",
    "webhook.endpoint_worker_share",
    "webhook_host.breaker_failures",
    "webhook_host.breaker_cool_down_seconds",
    "webhook.delivery_max_attempts",
    "kind.poll_charge.max_attempts",
    "kind.poll_charge.timeout_seconds",
    "kind.poll_charge.max_deferrals",
    "kind.webhook_deliver.max_attempts",
    "kind.task.max_attempts",
]


def print_config(*args: str) -> dict[str, dict]:
    out = StringIO()
    call_command("runworker", "--print-config", "--format", "json", *args, stdout=out)
    return {c["name"]: c for c in json.loads(out.getvalue())}


@pytest.fixture
def no_worker_env(monkeypatch):
    for name in (
        "VPAY_WORKER_CONCURRENCY",
        "VPAY_WORKER_QUEUES",
        "VPAY_WORKER_HEARTBEAT_SECONDS",
        "VPAY_WORKER_GRACE_SECONDS",
        "VPAY_RAIL_MAX_IN_FLIGHT",
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_print_config_lists_every_named_ceiling_with_its_default_source(no_worker_env):
    found = print_config()
    assert [name for name in NAMED if name not in found] == []
    assert found["worker.concurrency"] == {"name": "worker.concurrency", "value": 4, "source": "default"}
    assert found["worker.prefetch"]["value"] == 0
    assert found["claim.max_tenants_per_claim"]["value"] == 64
    assert found["rail.max_in_flight"]["source"] == "setting VPAY_RAIL_MAX_IN_FLIGHT"
    assert found["rail.worker_share"]["value"] == 2
    assert found["kind.webhook_deliver.max_attempts"]["value"] == 10
    assert found["worker.lease_seconds"]["value"] == 12.0


def test_a_flag_changes_the_value_and_the_source_and_what_derives_from_it(no_worker_env):
    found = print_config("--concurrency", "10", "--grace", "7")
    assert found["worker.concurrency"]["value"] == 10
    assert found["worker.concurrency"]["source"] == "flag --concurrency"
    assert found["worker.grace_seconds"] == {"name": "worker.grace_seconds", "value": 7.0, "source": "flag --grace"}
    assert found["rail.worker_share"]["value"] == 5
    assert found["webhook.endpoint_worker_share"]["value"] == 5
    assert "flag --concurrency" in found["rail.worker_share"]["source"]


def test_an_env_var_changes_the_value_and_the_source_and_a_flag_wins_over_it(no_worker_env):
    no_worker_env.setenv("VPAY_WORKER_CONCURRENCY", "8")
    no_worker_env.setenv("VPAY_WORKER_HEARTBEAT_SECONDS", "2")
    found = print_config()
    assert found["worker.concurrency"] == {
        "name": "worker.concurrency",
        "value": 8,
        "source": "env VPAY_WORKER_CONCURRENCY",
    }
    assert found["worker.heartbeat_seconds"]["source"] == "env VPAY_WORKER_HEARTBEAT_SECONDS"
    assert found["worker.lease_seconds"]["value"] == 6.0
    assert print_config("--concurrency", "3")["worker.concurrency"]["source"] == "flag --concurrency"


def test_an_env_var_that_does_not_parse_is_refused_by_name(no_worker_env):
    no_worker_env.setenv("VPAY_WORKER_CONCURRENCY", "many")
    with pytest.raises(CommandError, match="VPAY_WORKER_CONCURRENCY"):
        print_config()


def test_a_setting_changes_its_ceiling_and_its_variable_set_in_the_environment_is_named(no_worker_env):
    with override_settings(VPAY_RAIL_MAX_IN_FLIGHT=3, VPAY_WEBHOOK_BREAKER_FAILURES=4):
        found = print_config()
    assert found["rail.max_in_flight"]["value"] == 3
    assert found["webhook_host.breaker_failures"]["value"] == 4
    no_worker_env.setenv("VPAY_RAIL_MAX_IN_FLIGHT", "3")
    assert print_config()["rail.max_in_flight"]["source"] == "env VPAY_RAIL_MAX_IN_FLIGHT"


def test_the_table_is_aligned_one_ceiling_per_line(no_worker_env):
    out = StringIO()
    call_command("runworker", "--print-config", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["ceiling", "value", "source"]
    assert any(line.startswith("worker.concurrency ") and line.endswith("default") for line in lines)
    assert (
        len(lines)
        == len(
            ceilings.collect(concurrency=4, queues="default", heartbeat_seconds=5, lease_seconds=12, grace_seconds=30)
        )
        + 1
    )


def test_publish_sets_a_gauge_per_numeric_ceiling_and_returns_them_all():
    worker = Worker(concurrency=6, queues=("default", "bulk"))
    worker.option_sources = {"concurrency": "flag --concurrency"}
    published = ceilings.publish(worker)
    assert published["worker.concurrency"] == 6
    assert published["worker.queues"] == "default,bulk"
    assert REGISTRY.get_sample_value("vpay_ceiling", {"name": "worker.concurrency"}) == 6
    assert REGISTRY.get_sample_value("vpay_ceiling", {"name": "rail.worker_share"}) == 3
    assert REGISTRY.get_sample_value("vpay_ceiling", {"name": "worker.queues"}) is None
    assert ceilings.of_worker(worker)[0].source == "flag --concurrency"


@pytest.mark.django_db(transaction=True)
def test_print_config_in_a_real_process_exits_zero_without_starting_a_worker(start_worker):
    worker = start_worker("--print-config", "--format", "json", env={"VPAY_RAIL_MAX_IN_FLIGHT": "3"})
    assert wait_exit(worker, timeout=60) == 0, worker.output()[-3000:]
    text = worker.output()
    found = {c["name"]: c for c in json.loads(text[text.index("[") :])}
    assert found["rail.max_in_flight"] == {
        "name": "rail.max_in_flight",
        "value": 3,
        "source": "env VPAY_RAIL_MAX_IN_FLIGHT",
    }
    assert not any(r.get("message") == "worker started" for r in log_records(worker))


@pytest.mark.django_db(transaction=True)
def test_the_worker_started_line_and_its_metrics_carry_the_ceilings(start_worker):
    port = free_port()
    worker = start_worker("--concurrency", "3", "--metrics-port", str(port), env={"VPAY_WEBHOOK_MAX_IN_FLIGHT": "5"})
    wait_started(worker)
    (started,) = [r for r in log_records(worker) if r["message"] == "worker started"]
    assert started["ceilings"]["worker.concurrency"] == 3
    assert started["ceilings"]["webhook.endpoint_max_in_flight"] == 5
    samples = scrape(port)
    assert samples[("vpay_ceiling", (("name", "webhook.endpoint_max_in_flight"),))] == 5
    assert samples[("vpay_ceiling", (("name", "rail.worker_share"),))] == 1
    assert samples[("vpay_ceiling", (("name", "kind.poll_charge.max_deferrals"),))] == 100
