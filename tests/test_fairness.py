"""Claim fairness across tenants: one tenant's backlog cannot starve another's handful of jobs."""

from __future__ import annotations

import json

import pytest
from django.db import connection, transaction

from jobs.adapters import postgres as queue
from jobs.adapters.postgres import JobRequest
from jobs.kinds import JobKind
from jobs.runner.worker import Worker
from jobs.storage import leases
from tests.conftest import wait_for
from tests.queue_support import claim, claim_statement_params, count, execute, task_payload

NOOP = task_payload("tests.tasks.noop")
BACKLOG = 5_000


def enqueue_backlog_then_latecomers() -> None:
    """5,000 jobs of tenant "a", then, in a later transaction (a later run_at), 10 of "b"."""
    assert queue.enqueue_many([JobRequest("task", NOOP, tenant="a") for _ in range(BACKLOG)]) == BACKLOG
    assert queue.enqueue_many([JobRequest("task", NOOP, tenant="b") for _ in range(10)]) == 10
    if not connection.in_atomic_block:
        # "Later" on the database clock: an oldest-first claim would serve all of a first.
        assert count("jobs", "tenant = 'b' AND run_at <= (SELECT max(run_at) FROM jobs WHERE tenant = 'a')") == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("batch", [1, 10])
def test_a_tenants_ten_jobs_are_claimed_within_the_next_fifty_despite_another_tenants_backlog(batch):
    enqueue_backlog_then_latecomers()
    tenants: list[str] = []
    after = ""
    while len(tenants) < 50:
        result = claim("worker-a", batch=batch, after=after)
        assert result.jobs, "the queue ran dry"
        tenants += [job.tenant for job in result.jobs]
        after = result.next_after  # as a Worker carries its cursor from claim to claim
    assert tenants[:50].count("b") == 10, tenants


@pytest.mark.django_db(transaction=True)
def test_a_worker_running_a_backlog_finishes_another_tenants_ten_jobs_within_its_next_fifty():
    enqueue_backlog_then_latecomers()
    worker = Worker(concurrency=1)  # its tenant cursor is kept from claim to claim
    while worker.report().claimed < 50:
        assert worker.run_once() > 0
    assert worker.report().finished == 50
    assert count("jobs", "tenant = 'b'") == 0
    assert count("jobs", "tenant = 'a'") == BACKLOG - 40


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_every_tenant_starts_a_job_within_the_first_25_starts_whatever_the_handlers_duration(effects, start_worker):
    # 20 tenants x 20 jobs of 200 ms at --concurrency 4: slow handlers must not make the
    # tenant walk wrap back to the first tenants (a batch handed back used to).
    tenants = [f"merchant-{t:02d}" for t in range(20)]
    queue.enqueue_many(
        JobRequest("task", task_payload("tests.tasks.record_then_sleep", f"{tenant}/{i}", 0.2), tenant=tenant)
        for i in range(20)
        for tenant in tenants
    )
    worker = start_worker("--concurrency", "4")
    wait_for(lambda: len(effects()) >= 32, timeout=60, message="32 jobs started")
    worker.kill()
    starts = [label.split("/")[0] for label, _ in effects()][:25]
    assert set(starts) == set(tenants), starts


@pytest.mark.django_db
def test_the_claim_statement_uses_the_ready_index():
    enqueue_backlog_then_latecomers()
    execute("ANALYZE jobs")
    params = claim_statement_params(batch=10)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + leases.CLAIM, params)
        plan = cursor.fetchone()[0]
    plan_text = plan if isinstance(plan, str) else json.dumps(plan)
    nodes = _nodes(json.loads(plan_text)[0]["Plan"])
    on_jobs = [n for n in nodes if n.get("Relation Name") == "jobs"]
    # Every read of jobs in the tenant walk and the per-tenant pick goes through the index;
    # none scans the table (the UPDATE's own target aside, reached by primary key).
    assert any(n.get("Index Name") == "jobs_job_ready_idx" for n in on_jobs), on_jobs
    assert not [n for n in on_jobs if n["Node Type"] == "Seq Scan"], on_jobs


def _nodes(plan: dict) -> list[dict]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


@pytest.mark.django_db(transaction=True)
def test_housekeeping_and_alerts_are_claimed_among_the_first_starts_behind_merchants_backlogs():
    """The system's own work is tenant '' (the singletons, send_alert): one more tenant in
    the walk, so a due sweep or alert waits one round of the merchants with work, not their
    backlogs. 20 merchants with 50 jobs each, then the singletons and an alert."""
    from jobs.maintenance.singletons import seed_singletons
    from jobs.operator.alerts import raise_alert

    for m in range(20):
        queue.enqueue_many([JobRequest("task", NOOP, tenant=f"mer_{m:02d}") for _ in range(50)])
    seeded = seed_singletons()
    with transaction.atomic():
        raise_alert(key="fairness-test", title="a human must look", source="tests")
    system = count("jobs", "tenant = ''")
    assert system == len(seeded) + 1 and system >= 5
    starts: list[str] = []
    after = ""
    while len(starts) < 2 * (20 + 1):  # two rounds of every tenant with work
        result = claim("worker-a", batch=1, after=after)
        starts += [job.kind if job.tenant == "" else job.tenant for job in result.jobs]
        after = result.next_after
    # One system job per round of the walk, like any merchant: two within the first 42 starts.
    assert sum(1 for s in starts[:21] if not s.startswith("mer_")) == 1, starts[:21]
    assert sum(1 for s in starts if not s.startswith("mer_")) == 2, starts


@pytest.mark.django_db
def test_the_tenant_walk_wraps_past_the_last_tenant_to_the_ones_before_the_cursor():
    for tenant in "abc":
        queue.enqueue(JobKind.TASK, task_payload(), tenant=tenant)
    # Starting after 'b': 'c', then round to 'a' and 'b'; without the wrap only 'c' is served.
    got = claim("worker-a", batch=3, after="b").jobs
    assert sorted(j.tenant for j in got) == ["a", "b", "c"]
    assert claim("worker-a", batch=3, after="b").jobs == []  # and none twice
