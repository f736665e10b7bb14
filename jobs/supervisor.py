"""The process model: ``runworker --processes N`` runs N worker processes and supervises them.

One Python process runs its executors' Python on one core at a time; N processes use N. The
supervisor does the setup once (options, checks), then forks the workers (each a whole
:class:`~jobs.worker.Worker`: its own executors, beat, reaper, connections) and does
nothing but watch them, as Solid Queue's supervisor and gunicorn's arbiter do:

* **A child that dies** (a signal, a crash, an exit it was not asked for) is seen at once,
  by ``waitpid``: its jobs are rescued then, by the reaper's statement with the existing
  crash attribution (``jobs.reaper``: alone -> attempt spent, beside others -> refunded and
  a suspect), instead of waiting out its lease, and its ``workers`` row goes. A new child
  takes its place, after a pause that doubles while children keep dying young (1 s to 30 s).
* **SIGTERM or SIGINT** is passed to every child as SIGTERM: each drains (its grace clock
  starts then); a second signal is passed on too, and each exits at once, as a single
  worker does. The children ignore SIGINT themselves, so a terminal's Ctrl-C (sent to the
  whole process group) reaches them once, through the supervisor.
* **The supervisor itself killed** (SIGKILL): each child is sent SIGTERM by the kernel
  (``PR_SET_PDEATHSIG``, Linux) and drains; elsewhere children run on until stopped.
* ``--burst``: a child that exits 0 has drained and is not replaced; the supervisor exits
  once every child has, 0 if all exited 0.

Children are named ``<worker-id>.<n>`` (a replacement ``<worker-id>.<n>r<k>``); with
``--metrics-port P`` child n serves its metrics on ``P + n - 1``.
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

from jobs import cancels, liveness, reaper
from jobs.settling import DB_ERRORS
from vpay import metrics
from vpay.errors import error_chain

logger = logging.getLogger("jobs.worker")

RESTART_PAUSE_SECONDS = 1.0
RESTART_PAUSE_CAP_SECONDS = 30.0
# A child that lived this long before dying resets the pause: it was not a crash loop.
HEALTHY_AFTER_SECONDS = 60.0
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

    def __init__(
        self, *, processes: int, base_id: str, burst: bool, run_child: Callable[[str, int], int]
    ) -> None:
        self.processes = processes
        self.base_id = base_id
        self.burst = burst
        self.run_child = run_child
        self.children: dict[int, Child] = {}  # pid -> child
        self.signals = 0
        self.codes: dict[int, int] = {}  # number -> the exit code of its last child
        self._restarts: dict[int, int] = {}
        self._pause = RESTART_PAUSE_SECONDS

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        connections.close_all()  # never share a connection with a child
        for number in range(1, self.processes + 1):
            self._spawn(number)
        logger.info(
            "supervisor started",
            extra={"worker_id": self.base_id, "processes": self.processes, "burst": self.burst},
        )
        while self.children:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            child = self.children.pop(pid, None)
            if child is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            self.codes[child.number] = code
            if self.signals or (self.burst and code == 0):
                continue  # asked to stop, or drained
            self._died(child, code)
            self._pause_before_restart(child)
            if not self.signals:
                self._spawn(child.number)
        connections.close_all()
        failed = {n: c for n, c in self.codes.items() if c != 0}
        logger.info("supervisor stopped", extra={"worker_id": self.base_id, "exit_codes": str(self.codes)})
        return 1 if failed else 0

    # --- children ---------------------------------------------------------------------

    def _spawn(self, number: int) -> None:
        restarts = self._restarts.get(number, 0)
        worker_id = f"{self.base_id}.{number}" + (f"r{restarts}" if restarts else "")
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the supervisor's code
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches it through the supervisor
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # run_child installs its own
                _die_with(parent)
                code = self.run_child(worker_id, number)
            except BaseException:  # a child must reach os._exit whatever happened
                logger.critical("a worker process failed to run", exc_info=True, extra={"worker_id": worker_id})
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.children[pid] = Child(number, worker_id, pid, time.monotonic())

    def _died(self, child: Child, code: int) -> None:
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        logger.critical(
            "a worker process died; rescuing its jobs now",
            extra={"worker_id": child.worker_id, "pid": child.pid, "how": how, "alert": True},
        )
        try:
            rescue(child.worker_id)
        except DB_ERRORS as exc:
            # The reapers of the other children rescue them once its lease runs out.
            logger.warning(
                "could not rescue a dead worker's jobs now; its lease will",
                extra={"worker_id": child.worker_id, "error": error_chain(exc, 300)},
            )
        finally:
            connections.close_all()

    def _pause_before_restart(self, child: Child) -> None:
        if time.monotonic() - child.started >= HEALTHY_AFTER_SECONDS:
            self._pause = RESTART_PAUSE_SECONDS
        deadline = time.monotonic() + self._pause
        self._pause = min(self._pause * 2, RESTART_PAUSE_CAP_SECONDS)
        self._restarts[child.number] = self._restarts.get(child.number, 0) + 1
        while not self.signals and time.monotonic() < deadline:
            time.sleep(0.05)

    def _on_signal(self, signum, frame) -> None:
        self.signals += 1
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def rescue(worker_id: str) -> int:
    """Rescue the jobs of a worker process known to be dead, and remove its row; the count
    released or dead-lettered."""
    reaped = reaper.reap_expired_leases(None, dead=worker_id)
    cancels.sweep_waiting()
    liveness.worker_deregister(worker_id)
    if reaped.released or reaped.dead_lettered:
        metrics.LEASES_REAPED.labels(result="released").inc(reaped.released)
        metrics.LEASES_REAPED.labels(result="dead_lettered").inc(reaped.dead_lettered)
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
    a no-op elsewhere), and drain at once if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
