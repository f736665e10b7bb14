"""jobs.primitives.group_commit: requests of concurrent threads run as one batch, each
answered on its own, and a failing batch run again one request at a time."""

from __future__ import annotations

import threading
import time

import pytest

from jobs.primitives.group_commit import GroupCommit


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


class Held:
    """A batch function whose first batch waits for a release, recording every batch it ran."""

    def __init__(self, answer=lambda r: r * 10, fail_on=()):
        self.batches: list[list] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.answer = answer
        self.fail_on = set(fail_on)

    def __call__(self, requests):
        self.batches.append(list(requests))
        if len(self.batches) == 1:
            self.entered.set()
            assert self.release.wait(5)
        if self.fail_on & set(requests):
            raise ValueError(f"refused {sorted(self.fail_on & set(requests))}")
        return [self.answer(r) for r in requests]


def submit_all(group, requests):
    """Submit each request from a thread of its own; returns {request: answer or exception}."""
    answers: dict = {}

    def one(r):
        try:
            answers[r] = group.submit(r)
        except BaseException as exc:
            answers[r] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in requests]
    for t in threads:
        t.start()
    return threads, answers


def while_a_batch_runs(group, fn, later):
    """Request 0 leads a batch that ``fn`` holds; ``later`` arrive and wait; then it is let
    go. Returns (request 0's answer, the later ones' answers)."""
    first, answers = submit_all(group, [0])
    assert fn.entered.wait(5)
    rest, more = submit_all(group, later)
    wait_until(lambda: len(group._waiting) == len(later))
    fn.release.set()
    for t in first + rest:
        t.join(5)
    return answers, more


def test_a_lone_request_runs_at_once_as_a_batch_of_one():
    group = GroupCommit(lambda rs: [r + 1 for r in rs])
    assert group.submit(1) == 2
    assert (group.batches, group.requests) == (1, 1)


def test_requests_that_arrive_while_a_batch_runs_share_the_next_one_and_each_gets_its_own_answer():
    fn = Held()
    answers, more = while_a_batch_runs(GroupCommit(fn), fn, range(1, 8))
    assert answers == {0: 0} and more == {r: r * 10 for r in range(1, 8)}
    assert fn.batches[0] == [0] and sorted(fn.batches[1]) == list(range(1, 8)) and len(fn.batches) == 2


def test_a_batch_is_never_larger_than_its_bound():
    fn = Held()
    _, answers = while_a_batch_runs(GroupCommit(fn, max_batch=3), fn, range(1, 8))
    assert answers == {r: r * 10 for r in range(1, 8)}
    assert max(len(b) for b in fn.batches) == 3 and sorted(r for b in fn.batches[1:] for r in b) == list(range(1, 8))


def test_a_failing_batch_is_run_again_one_request_at_a_time_so_only_the_bad_request_fails():
    fn = Held(fail_on={5})
    _, answers = while_a_batch_runs(GroupCommit(fn), fn, range(1, 8))
    assert isinstance(answers.pop(5), ValueError)
    assert answers == {r: r * 10 for r in (1, 2, 3, 4, 6, 7)}
    # The batch again, one request at a time, each in the thread that asked for it.
    assert sorted(fn.batches[2:]) == [[r] for r in sorted(fn.batches[1])]


def test_an_answer_count_that_does_not_match_is_an_error_for_every_request_not_a_hang():
    group = GroupCommit(lambda rs: [])
    with pytest.raises(RuntimeError, match="0 answers for 1 requests"):
        group.submit(1)


def test_an_exception_that_is_not_an_error_reaches_every_waiter_without_a_retry():
    calls = []

    def interrupted(requests):
        calls.append(list(requests))
        raise KeyboardInterrupt

    group = GroupCommit(interrupted)
    with pytest.raises(KeyboardInterrupt):
        group.submit(1)
    assert calls == [[1]]
    assert group.submit.__self__._leading is False  # the next caller can lead


def test_max_batch_must_be_positive():
    with pytest.raises(ValueError):
        GroupCommit(lambda rs: rs, max_batch=0)


def test_a_request_of_a_failed_batch_runs_again_in_the_thread_that_asked_for_it():
    # A leader's broken connection must not fail the others: each reruns on its own.
    threads_seen: dict[int, str] = {}

    def fn(requests):
        if len(requests) > 1:
            raise ConnectionError("the leader's connection broke")
        threads_seen[requests[0]] = threading.current_thread().name
        return [requests[0]]

    held = Held(answer=lambda r: r)
    group = GroupCommit(lambda rs: held(rs) if rs == [0] else fn(rs))
    first, _ = submit_all(group, [0])
    assert held.entered.wait(5)
    rest, answers = submit_all(group, range(1, 5))
    wait_until(lambda: len(group._waiting) == 4)
    names = {r: t.name for r, t in zip(range(1, 5), rest, strict=True)}
    held.release.set()
    for t in first + rest:
        t.join(5)
    assert answers == {r: r for r in range(1, 5)}
    assert threads_seen == names
