"""The resources of a benchmark's worker while it runs: the CPU and RSS of the ``runworker``
process and the worker processes it forked (from ``/proc``), the machine's CPU, CPU by role
(the worker, the benchmark database's backends, the database server's own processes, nginx,
the kernel's workers) and the worker's database connections. Used by ``bench_webhooks.py``."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from bench import target


class Resources:
    """The worker's CPU and RSS (from /proc), the machine's CPU, and the database's backends,
    sampled while a run lasts."""

    def __init__(self, pid: int, db: str) -> None:
        self.pid = pid
        self.db = db  # the benchmark's database: its backends are counted
        self.rss_kib: list[tuple[int, int]] = []  # (deliveries succeeded so far, RSS)
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

    @staticmethod
    def machine_cpu() -> float:
        jiffies = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        busy = sum(jiffies) - jiffies[3] - jiffies[4]  # all but idle and iowait
        return busy / os.sysconf("SC_CLK_TCK")

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far by role: the worker, its database's backends, the database
        server's own processes (WAL writer, checkpointer...), nginx, and the kernel's workers
        (writeback). Other processes on the machine are left out; a process that exited
        during the run is not counted."""
        out: dict[str, float] = {}
        tick = os.sysconf("SC_CLK_TCK")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                raw = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            name = raw[raw.index("(") + 1 : raw.rindex(")")]
            if int(entry.name) in self.worker_pids():
                role = "worker"
            elif name == "postgres" and f" {self.db} " in cmdline:
                role = "postgres backends"
            elif name == "postgres" and " root " not in cmdline and "postgres: " in cmdline:
                role = "postgres server"
            elif name == "nginx":
                role = "nginx"
            elif name.startswith("kworker"):
                role = "kernel workers"
            else:
                continue
            fields = raw.rsplit(")", 1)[1].split()
            out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        return out

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
        """RSS: the largest of the worker processes' (each is one worker; the supervisor is small)."""
        rss = 0
        for pid in self.worker_pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss = max(rss, int(line.split()[1]))
            except OSError:
                continue
        self.rss_kib.append((done, rss))
        with psycopg.connect(target.url(self.db), autocommit=True) as conn:
            # The worker's backends: its application names start with "vpay-" (the bench's
            # own connections carry "bench" or none).
            n = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name LIKE 'vpay-%%'",
                [self.db],
            ).fetchone()[0]
        self.backends = max(self.backends, n)
