"""CPU seconds so far by role, from ``/proc``: the processes a benchmark started (each with
the processes it forked), the benchmark database's backends, the database server's own
processes (WAL writer, checkpointer...), nginx and the kernel's workers (writeback). Other
processes on the machine are left out; a process that exited since is not counted, so a
role's figure is a floor. Used by ``worker_resources.py`` and ``bench_api_e2e.py``."""

from __future__ import annotations

import os
from pathlib import Path


def machine_cpu() -> float:
    """CPU seconds so far of the whole machine: all but idle and iowait."""
    jiffies = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    busy = sum(jiffies) - jiffies[3] - jiffies[4]
    return busy / os.sysconf("SC_CLK_TCK")


def descendants(roots: dict[str, int]) -> dict[int, str]:
    """Each root's pid and those of its children and grandchildren (gunicorn's workers,
    runworker's worker processes), with the root's role."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    role_of = {pid: role for role, pid in roots.items()}
    for pid in parent:
        seen, up = [], pid
        while up not in role_of and up in parent and up > 1 and len(seen) < 8:
            seen.append(up)
            up = parent[up]
        if up in role_of:
            for p in seen:
                role_of[p] = role_of[up]
    return role_of


def cpu_by_role(roots: dict[str, int], db: str) -> dict[str, float]:
    """CPU seconds so far of each role (see the module docstring)."""
    role_of = descendants(roots)
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
        role = role_of.get(int(entry.name))
        if name == "nginx":  # started by the benchmark, but a role of its own
            role = "nginx"
        elif role is not None:
            pass
        elif name == "postgres" and f" {db} " in cmdline:
            role = "postgres backends"
        elif name == "postgres" and " root " not in cmdline and "postgres: " in cmdline:
            role = "postgres server"
        elif name.startswith("kworker"):
            role = "kernel workers"
        else:
            continue
        fields = raw.rsplit(")", 1)[1].split()
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def per_item_ms(before: dict[str, float], after: dict[str, float], items: int) -> dict[str, float]:
    """Each role's CPU ms per item between two :func:`cpu_by_role` readings."""
    return {
        role: round((after[role] - before.get(role, 0.0)) * 1000 / items, 3)
        for role in after
        if after[role] - before.get(role, 0.0) > 0
    }
