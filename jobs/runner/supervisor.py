"""The process model: ``runworker --processes N`` runs N worker processes and supervises them.

One Python process runs its executors' Python on one core at a time; N processes use N. The
supervisor does the setup once (options, checks), then forks the workers (each a whole
:class:`~jobs.runner.worker.Worker`: its own executors, beat, reaper, connections) and does
nothing but watch them, as Solid Queue's supervisor and gunicorn's arbiter do:

* **A child that ends** without being asked to (a signal, a crash, any exit) is seen
  within 50 ms (``waitpid``, polled so that a replacement's pause delays nothing): its jobs
  are rescued then, by the reaper's statement naming it (crash attribution unchanged:
  ``jobs.maintenance.reaper``, alone -> attempt spent, beside others -> refunded and a suspect), not a
  lease later, and its ``workers`` row goes. A new child takes its place after a pause that
  doubles while children keep dying young (1 s to 30 s); with ``--burst`` a slot whose
  children died young five times in a row is given up and the supervisor exits 1. A child
  that ends with an error during a stop is rescued too, and not replaced.
* **SIGTERM or SIGINT** reaches every child as SIGTERM (each drains; its grace clock starts
  then); any later one as SIGQUIT (each exits at once, as a single worker does at a second
  signal). A child takes every SIGTERM as "drain", so one sent to the whole process group
  or cgroup besides the supervisor's (systemd's stop, ``kill -- -PGID``) never cuts its drain
  short, and it ignores SIGINT: a terminal's Ctrl-C reaches it through the supervisor.
* **The supervisor itself killed** (SIGKILL): each child is sent SIGTERM by the kernel
  (``PR_SET_PDEATHSIG``, Linux) and drains; elsewhere children run on until stopped.
* ``--burst``: a child that exits 0 has drained and is not replaced; the supervisor exits
  once every child has, 0 if all exited 0.

Children are named ``<worker-id>.<n>`` (a replacement ``<worker-id>.<n>r<k>``): like a
single worker's id, ``--worker-id`` must be unique among the workers running (a supervisor
started again under the same id while the previous one's children still drain would
rescue their jobs as its own dead child's). With ``--metrics-port P`` child n serves its
metrics on ``P + n - 1``; the supervisor serves none (its rescues are in its log lines).
The one gap a lease used to cover: a statement a killed child had sent in autocommit may
still commit after its job was rescued (PostgreSQL notices a client gone only when it
writes to it); fenced work cannot, its transaction dies with the connection.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from jobs.maintenance import liveness, reaper
from jobs.runner.settling import DB_ERRORS
from vpay.errors import error_chain

logger = logging.getLogger("jobs.runner.worker")

RESTART_PAUSE_SECONDS = 1.0
RESTART_PAUSE_CAP_SECONDS = 30.0
# A child that lived this long before dying resets the pause: it was not a crash loop.
HEALTHY_AFTER_SECONDS = 60.0
# --burst: a slot whose children died this many times in a row, young, is given up.
BURST_GIVE_UP_AFTER = 5
POLL_SECONDS = 0.05
_PR_SET_PDEATHSIG = 1


@dataclass(slots=True)
class Child:
    number: int  # 1..N: its slot
    worker_id: str
    pid: int
    started: float  # monotonic


class Supervisor:
    """Forks ``processes`` children, each running ``run_child(worker_id, number)`` (which
    returns the child's exit code), and supervises them (see the module docstring)."""

    def __init__(self, *, processes: int, base_id: str, burst: bool, run_child: Callable[[str, int], int]) -> None:
        self.processes = processes
        self.base_id = base_id
        self.burst = burst
        self.run_child = run_child
        self.children: dict[int, Child] = {}  # pid -> child
        self.signals = 0
        self.codes: dict[int, int] = {}  # number -> the exit code of its last child
        self._restarts: dict[int, int] = {}  # number -> replacements so far
        self._young_deaths: dict[int, int] = {}  # number -> deaths in a row before HEALTHY_AFTER
        self._due: dict[int, float] = {}  # number -> when (monotonic) its replacement starts
        self._gave_up: set[int] = set()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        connections.close_all()  # never share a connection with a child
        for number in range(1, self.processes + 1):
            if self.signals:
                break
            self._spawn(number)
        logger.info(
            "supervisor started",
            extra={"worker_id": self.base_id, "processes": self.processes, "burst": self.burst},
        )
        # Polled, not a blocking waitpid: a replacement's pause must not delay seeing (and
        # rescuing) another child that dies meanwhile.
        while self.children or (self._due and not self.signals):
            pid, status = os.waitpid(-1, os.WNOHANG) if self.children else (0, 0)
            if pid == 0:
                self._start_due()
                time.sleep(POLL_SECONDS)
                continue
            child = self.children.pop(pid, None)
            if child is not None:
                self._ended(child, os.waitstatus_to_exitcode(status))
        connections.close_all()
        logger.info("supervisor stopped", extra={"worker_id": self.base_id, "exit_codes": str(self.codes)})
        return 1 if self._gave_up or any(code != 0 for code in self.codes.values()) else 0

    # --- children ---------------------------------------------------------------------

    def _spawn(self, number: int) -> None:
        restarts = self._restarts.get(number, 0)
        worker_id = f"{self.base_id}.{number}" + (f"r{restarts}" if restarts else "")
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        # A stop signal arriving mid-fork waits until the child is registered, so that it
        # is passed on to this child too; the child resets the handlers before it may see one.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            pid = os.fork()
            if pid == 0:  # the child: never returns into the supervisor's code
                code = 1
                try:
                    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches it through the supervisor
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # run_child installs its own
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                    _die_with(parent)
                    code = self.run_child(worker_id, number)
                except BaseException:  # a child must reach os._exit whatever happened
                    logger.critical("a worker process failed to run", exc_info=True, extra={"worker_id": worker_id})
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            self.children[pid] = Child(number, worker_id, pid, time.monotonic())
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _ended(self, child: Child, code: int) -> None:
        """A child exited: rescue what it held unless it exited cleanly, and replace it
        unless it was asked to stop or had drained (--burst)."""
        self.codes[child.number] = code
        if code == 0 and (self.signals or self.burst):
            return  # drained: it acknowledged and handed back everything itself
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        logger.critical(
            "a worker process ended; rescuing its jobs now",
            extra={"worker_id": child.worker_id, "pid": child.pid, "how": how, "alert": not self.signals},
        )
        try:
            rescue(child.worker_id)
        except DB_ERRORS as exc:
            # The other workers' reapers rescue them once its lease runs out.
            logger.warning(
                "could not rescue a dead worker's jobs now; its lease will",
                extra={"worker_id": child.worker_id, "error": error_chain(exc, 300)},
            )
        finally:
            connections.close_all()
        if self.signals:
            return
        lived = time.monotonic() - child.started
        young = 0 if lived >= HEALTHY_AFTER_SECONDS else self._young_deaths.get(child.number, 0) + 1
        self._young_deaths[child.number] = young
        if self.burst and young >= BURST_GIVE_UP_AFTER:
            # A burst is expected to end: a slot whose child keeps dying is given up (exit 1).
            self._gave_up.add(child.number)
            logger.critical(
                "a worker process keeps dying; not replacing it",
                extra={"worker_id": child.worker_id, "deaths_in_a_row": young, "alert": True},
            )
            return
        pause = min(RESTART_PAUSE_SECONDS * 2 ** max(young - 1, 0), RESTART_PAUSE_CAP_SECONDS)
        self._restarts[child.number] = self._restarts.get(child.number, 0) + 1
        self._due[child.number] = time.monotonic() + pause

    def _start_due(self) -> None:
        now = time.monotonic()
        for number, due in list(self._due.items()):
            if due <= now and not self.signals:
                del self._due[number]
                self._spawn(number)

    def _on_signal(self, signum, frame) -> None:
        # The first stop is passed on as SIGTERM (drain); any later one as SIGQUIT (exit now).
        # A child takes every SIGTERM as "drain", so one sent to the whole process group or
        # cgroup (systemd, kill -- -PGID) besides the supervisor's never cuts its drain short.
        self.signals += 1
        sent = signal.SIGTERM if self.signals == 1 else signal.SIGQUIT
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sent)


def rescue(worker_id: str) -> int:
    """Rescue the jobs of a worker process known to be dead, and remove its row; the count
    released or dead-lettered. Logged every time, counted in no metric: the supervisor serves
    none, and a counter raised here would be inherited by every child forked after it. (The
    children's reapers end rescued jobs whose cancel was requested, at their next reap.)"""
    reaped = reaper.reap_expired_leases(None, dead=worker_id)
    liveness.worker_deregister(worker_id)
    logger.warning(
        "rescued the jobs of a dead worker",
        extra={
            "reaper": "supervisor",
            "dead_worker": worker_id,
            "released": reaped.released,
            "suspects": reaped.suspects,
            "dead_lettered": reaped.dead_lettered,
            "alert": bool(reaped.unalerted),
        },
    )
    return reaped.released + reaped.dead_lettered


def _die_with(parent: int) -> None:
    """Ask the kernel to send this child SIGTERM when its supervisor dies (Linux's prctl;
    elsewhere, or if it refuses, children run on until stopped), and end now if it already
    has (this child holds nothing yet)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
                logger.warning("could not ask to be stopped with the supervisor (prctl)")
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
