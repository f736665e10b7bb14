"""The resources of a benchmark's worker while it runs: the CPU and RSS of the ``runworker``
process and the worker processes it forked (from ``/proc``), the machine's CPU, CPU by role
(the worker, the benchmark database's backends, the database server's own processes, nginx,
the kernel's workers) and the worker's database connections. Used by ``bench_webhooks.py``."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from bench import cpu_roles, target


class Resources:
    """The worker's CPU and RSS (from /proc), the machine's CPU, and the database's backends,
    sampled while a run lasts."""

    def __init__(self, pid: int, db: str) -> None:
        self.pid = pid
        self.db = db  # the benchmark's database: its backends are counted
        self.rss_kib: list[tuple[int, int]] = []  # (deliveries succeeded so far, RSS)
        # (deliveries succeeded so far, threads): a worker's send pool starts its threads as
        # batches need them, so RSS growing with the thread count is the pool filling up.
        self.threads: list[tuple[int, int]] = []
        self.backends = 0

    def proc_cpu(self) -> float:
        """CPU seconds so far of the worker processes (the runworker and those it forked)."""
        total = 0
        for pid in self.worker_pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    machine_cpu = staticmethod(cpu_roles.machine_cpu)

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far by role (``bench/cpu_roles.py``), the worker's processes as "worker"."""
        return cpu_roles.cpu_by_role({"worker": self.pid}, self.db)

    def worker_pids(self) -> set[int]:
        """The runworker process and the worker processes it forked (``--processes``)."""
        pids = {self.pid}
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == self.pid:
                    pids.add(int(entry.name))
            except OSError:
                continue
        return pids

    def sample(self, done: int) -> None:
        """RSS and threads: the largest of the worker processes' (each is one worker; the
        supervisor is small)."""
        rss = threads = 0
        for pid in self.worker_pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss = max(rss, int(line.split()[1]))
                    elif line.startswith("Threads:"):
                        threads = max(threads, int(line.split()[1]))
            except OSError:
                continue
        self.rss_kib.append((done, rss))
        self.threads.append((done, threads))
        with psycopg.connect(target.url(self.db), autocommit=True) as conn:
            # The worker's backends: its application names start with "vpay-" (the bench's
            # own connections carry "bench" or none).
            n = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name LIKE 'vpay-%%'",
                [self.db],
            ).fetchone()[0]
        self.backends = max(self.backends, n)
