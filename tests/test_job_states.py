"""The job state machine under Hypothesis, against the real database.

Every rule drives the real code path: enqueue (``jobs.adapters.postgres``), claim
(``jobs.storage.leases.claim``, after the worker's heartbeat), settle (the decision table and the
runner's ``Settler``), crash (the worker's row dropped and its leases expired on the
database clock), reap (``jobs.maintenance.reaper``), cancel (``jobs.services.cancels.job_cancel``),
replay and discard (``jobs.services.dead_letters``). After every step each job row and
dead letter is compared with what it was: every change must be an edge of
docs/architecture.md §8 (job: claimable ↔ leased, leaves by finish, dead letter or
cancel; dead letter: pending_review → replayed | discarded) *that the rule may cause*,
and nothing accepted is ever lost.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from jobs import registry
from jobs.adapters.postgres import enqueue
from jobs.kinds import JobKind
from jobs.maintenance import liveness, reaper
from jobs.runner.decisions import JobState, settle_error, settle_outcome
from jobs.runner.outcome import Outcome
from jobs.runner.report import Report
from jobs.runner.settling import Settler
from jobs.services.cancels import CancelRefused, job_cancel
from jobs.services.dead_letters import dead_letter_discard, dead_letter_replay
from jobs.storage import leases
from tests.queue_support import claim as claim_jobs
from tests.queue_support import task_payload
from tests.state_machine_support import FAST, HEAVY, check_edges, sql, truncate
from vpay.errors import PermanentError

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = ["w1", "w2"]
C, L = "claimable", "leased"
# What each rule may do to a job row (None: no row) and to a dead letter (None: none yet).
ROW_EDGES = {
    "enqueue": {(None, C)},
    "claim": {(C, L)},
    "settle": {(L, C), (L, None)},  # reschedule/retry/defer; finish, dead letter, cancelled
    "crash": set(),  # only lease columns move; the reaper acts
    "reap": {(L, C), (L, None)},  # released; buried (crashed_worker)
    "cancel": {(C, None), (L, None)},  # ended now (waiting, or its worker is dead); a request moves nothing
    "replay": {(None, C)},
    "discard": set(),
    "time_passes": set(),
}
LETTER_EDGES = {
    "settle": {(None, "pending_review"), (None, "discarded")},  # a failure; a cancel request honoured
    "reap": {(None, "pending_review")},
    "cancel": {(None, "discarded")},
    "replay": {("pending_review", "replayed")},
    "discard": {("pending_review", "discarded")},
}


def rows() -> dict[str, str]:
    """The machine's jobs (tasks): a dead letter's own send_alert job is not one of them."""
    return {
        str(j): (L if locked else C)
        for j, locked in sql("SELECT job_id, locked_at IS NOT NULL FROM jobs WHERE kind = 'task'")
    }


def snapshot() -> list[tuple]:
    """Everything a settle could write, for the check that a late one writes nothing."""
    return sql(
        "SELECT job_id, locked_by, lease_token, attempts, deferrals, run_at, last_error, crashes FROM jobs"
        " ORDER BY job_id"
    ) + sql("SELECT id, job_id, state FROM dead_letters ORDER BY id")


def letters() -> dict[int, str]:
    return dict(sql("SELECT id, state FROM dead_letters WHERE kind = 'task'"))


class JobMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        truncate("jobs", "dead_letters", "processed_jobs", "alerts", "workers")
        self.report = Report()
        self.held: list[tuple[str, leases.ClaimedJob]] = []  # what each worker believes it holds
        self.finished: set[str] = set()  # job_ids a finish settled
        self.known: set[str] = set()
        self.rows, self.letters = rows(), letters()

    def _step(self, rule_name: str) -> None:
        """Check the step's changes against the rule's edges, then remember the new state."""
        new_rows, new_letters = rows(), letters()
        check_edges("job", self.rows, new_rows, ROW_EDGES[rule_name], rule_name)
        check_edges("dead letter", self.letters, new_letters, LETTER_EDGES.get(rule_name, set()), rule_name)
        self.rows, self.letters = new_rows, new_letters

    @rule()
    def enqueue_task(self):
        self.known.add(str(enqueue(JobKind.TASK, task_payload(), dedupe_key=f"hyp:{uuid.uuid4()}", max_attempts=2)))
        self._step("enqueue")

    @rule(worker=st.sampled_from(WORKERS), batch=st.integers(1, 3))
    def claim(self, worker, batch):
        liveness.worker_heartbeat(liveness.WorkerIdentity(worker, "host", 1, 4, "default"), 30.0)
        for job in claim_jobs(worker, batch=batch, lease_seconds=30.0).jobs:
            self.held.append((worker, job))
        self._step("claim")

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 1000), answer=st.sampled_from(["done", "retry", "reschedule", "defer", "permanent"]))
    def settle(self, i, answer):
        _worker, job = self.held.pop(i % len(self.held))
        current = sql("SELECT lease_token FROM jobs WHERE id = %s", [job.id])
        ours = bool(current) and current[0][0] == job.lease_token
        before = snapshot()
        spec = registry.get(job.kind)
        state = JobState(job.attempts, job.max_attempts, job.deferrals, spec.max_deferrals)
        settler = Settler(self.report)
        if answer == "done":
            settler.finish([job])
        elif answer == "permanent":
            settler.apply(job, settle_error(PermanentError.classification, "no", state, registry.retry_policy(spec)))
        else:
            outcome = {
                "retry": Outcome.retry_after(0, "again"),
                "reschedule": Outcome.reschedule_in(0),
                "defer": Outcome.defer(0, "later"),
            }[answer]
            settler.apply(job, settle_outcome(outcome, state))
        if not ours:
            # A late answer (its lease was taken: reaped, claimed again) changes nothing.
            assert snapshot() == before, f"a stale {answer} wrote something"
        elif answer == "done" and str(job.job_id) not in rows():
            self.finished.add(str(job.job_id))
        self._step("settle")

    @rule(worker=st.sampled_from(WORKERS))
    def crash(self, worker):
        """The worker dies: its row goes, its leases run out (on the database clock)."""
        sql("DELETE FROM workers WHERE id = %s", [worker])
        sql(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE locked_by = %s",
            [worker],
        )
        self._step("crash")

    @rule()
    def reap(self):
        expired = {str(j) for (j,) in sql("SELECT job_id FROM jobs WHERE lease_expires_at < now()")}
        reaper.reap_expired_leases()
        for job_id in set(self.rows) - expired:  # a live lease is never touched
            assert rows().get(job_id) == self.rows[job_id], f"the reaper moved {job_id}, whose lease was live"
        self._step("reap")

    @precondition(lambda self: self.rows)
    @rule(i=st.integers(0, 1000))
    def cancel(self, i):
        job_id = sorted(self.rows)[i % len(self.rows)]
        with contextlib.suppress(CancelRefused):  # a refusal moves nothing; the step still checks that
            job_cancel(job_id=job_id, actor="hypothesis", reason="rehearsal")
        self._step("cancel")

    @precondition(lambda self: "pending_review" in self.letters.values())
    @rule(i=st.integers(0, 1000), discard=st.booleans())
    def review(self, i, discard):
        pending = sorted(k for k, v in self.letters.items() if v == "pending_review")
        letter_id = pending[i % len(pending)]
        if discard:
            dead_letter_discard(letter_id=letter_id, actor="hypothesis", reason="checked by hand")
            self._step("discard")
        else:
            dead_letter_replay(letter_id=letter_id, actor="hypothesis")
            self._step("replay")

    @rule()
    def time_passes(self):
        sql("UPDATE jobs SET run_at = now() WHERE locked_at IS NULL AND run_at > now()")
        self._step("time_passes")

    @invariant()
    def nothing_is_lost_and_rows_are_whole(self):
        latest = dict(sql("SELECT DISTINCT ON (job_id) job_id::text, state FROM dead_letters ORDER BY job_id, id DESC"))
        for job_id in self.known:
            # Live, finished, or in front of a human (pending review) or closed by one.
            assert (
                job_id in self.rows
                or job_id in self.finished
                or latest.get(job_id)
                in (
                    "pending_review",
                    "discarded",
                )
            ), f"job {job_id} vanished (latest letter: {latest.get(job_id)})"
        assert sql(
            "SELECT count(*) FROM jobs WHERE attempts > max_attempts OR attempts < 0"
            " OR (locked_at IS NULL) <> (lease_token IS NULL) OR (locked_at IS NULL) <> (locked_by IS NULL)"
            " OR (locked_at IS NULL) <> (lease_expires_at IS NULL)"
        ) == [(0,)]
        assert sql(
            "SELECT count(*) FROM dead_letters WHERE attempts > max_attempts"
            " OR (state = 'discarded' AND coalesce(btrim(discard_reason), '') = '')"
        ) == [(0,)]
        assert self.report.lost >= 0


def test_the_job_state_machine_moves_only_along_its_table():
    run_state_machine_as_test(JobMachine, settings=FAST)


@pytest.mark.rehearse
def test_rehearsal__the_job_state_machine_with_a_large_budget():
    run_state_machine_as_test(JobMachine, settings=HEAVY)


def test_a_late_answer_after_the_reaper_rescued_its_job_writes_nothing():
    # The race the stale-settle check exists for, spelled out once: a claim, the worker
    # dies, the reaper frees the job, and the dead worker's answer arrives after all.
    machine = JobMachine()
    machine.enqueue_task()
    machine.claim(worker="w1", batch=1)
    machine.crash(worker="w1")
    machine.reap()
    machine.settle(i=0, answer="reschedule")
    machine.nothing_is_lost_and_rows_are_whole()
    machine.teardown()
