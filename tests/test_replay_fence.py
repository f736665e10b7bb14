"""Replay through the real worker loop and the real fence: a dead letter whose effect already
happened produces no second effect; one whose effect never happened produces exactly one."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from prometheus_client import REGISTRY

from jobs.adapters import postgres as queue
from jobs.models import DeadLetter, DeadLetterState
from jobs.runner.worker import Worker
from tests.queue_support import claim, count, expire_lease, task_payload

pytestmark = pytest.mark.django_db


@pytest.fixture
def alerts_elsewhere(settings):
    """The dead letters' alert jobs go to a queue this test's worker does not claim from."""
    settings.VPAY_ALERT_QUEUE = "alerts"


def bury_after_worker_death(label: str, job_id: uuid.UUID) -> DeadLetter:
    """Enqueue ``record(label)`` as ``job_id`` on its last attempt, claim it, let its worker "die"
    (the lease expires) and let a worker's reaper dead-letter it: the crashed_worker path."""
    assert queue.enqueue("task", task_payload("tests.tasks.record", label), job_id=job_id, max_attempts=1)
    (claimed,) = claim().jobs
    assert claimed.job_id == job_id
    expire_lease(job_id)
    assert Worker(concurrency=1).reap() == (0, 1)
    return DeadLetter.objects.get(job_id=job_id, state=DeadLetterState.PENDING_REVIEW)


def replay_in_admin(client, letter: DeadLetter) -> list[str]:
    url = reverse("admin:jobs_deadletter_changelist")
    response = client.post(url, {"action": "replay_selected", "_selected_action": [letter.pk], "post": "yes"})
    assert response.status_code == 302
    return [str(m) for m in get_messages(response.wsgi_request)]


def duplicates_skipped() -> float:
    return REGISTRY.get_sample_value("vpay_jobs_duplicates_skipped_total", {"kind": "task"}) or 0.0


def test_replaying_a_dead_letter_whose_effect_already_happened_produces_no_second_effect(
    client, operator, effects, alerts_elsewhere
):
    job_id = uuid.uuid4()
    # The job ran once: its effect and its fence row committed together.
    assert queue.enqueue("task", task_payload("tests.tasks.record", "charge-42"), job_id=job_id)
    worker = Worker(concurrency=1)
    assert worker.run_once() == 1
    assert effects("charge-42") == [("charge-42", "")]
    assert count("processed_jobs", "job_id = %s", [job_id]) == 1
    # A redelivery of the same job_id then died with its worker on its last attempt.
    letter = bury_after_worker_death("charge-42", job_id)
    skipped_before = duplicates_skipped()

    assert any("Replayed 1 dead letter" in m for m in replay_in_admin(client, letter))
    assert count("jobs", "job_id = %s", [job_id]) == 1
    assert worker.run_once() == 1

    # The fence saw the job_id: acked and skipped, not run again.
    assert effects("charge-42") == [("charge-42", "")]
    assert duplicates_skipped() == skipped_before + 1
    assert count("jobs", "kind = 'task'") == 0
    letter.refresh_from_db()
    assert letter.state == DeadLetterState.REPLAYED


def test_replaying_a_dead_letter_whose_effect_never_happened_applies_it_exactly_once(
    client, operator, effects, alerts_elsewhere
):
    job_id = uuid.uuid4()
    letter = bury_after_worker_death("refund-7", job_id)
    assert effects("refund-7") == []

    replay_in_admin(client, letter)
    worker = Worker(concurrency=1)
    assert worker.run_once() == 1
    assert effects("refund-7") == [("refund-7", "")]

    # A second replay of the same letter is refused; nothing more runs.
    assert any("was already replayed" in m for m in replay_in_admin(client, letter))
    assert worker.run_once() == 0
    assert effects("refund-7") == [("refund-7", "")]
