"""Processes a driver leaves behind: its local Ray's agents outlive a killed driver, so a reaper,
started in a session of its own, ends them once the driver is gone."""
from __future__ import annotations

import os
import subprocess
import sys

# Run apart from the driver (its own session, so the driver's death does not take it along):
# when the pipe from the driver closes (the driver ended or was killed), SIGKILL every process
# the driver's local Ray started that is still there. Ray's DashboardAgent and RuntimeEnvAgent
# ignore SIGTERM and outlive a killed driver, reparented to init. Start times guard against a
# process id that the system has since given to another process.
REAPER = """
import os, signal, sys
sys.stdin.buffer.read()
for item in sys.argv[1:]:
    pid, start = item.split(":")
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[19] == start:
                os.kill(int(pid), signal.SIGKILL)
    except (OSError, IndexError):
        pass
"""


def _stat(pid: int) -> list[str] | None:
    """Fields 3 on of /proc/PID/stat (after the command name, which may hold spaces), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(root: int) -> list[str]:
    """`pid:starttime` of every process below `root` (empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    stats = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if name.isdigit() and (fields := _stat(int(name))) is not None:
            stats[int(name)] = fields
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(f"{pid}:{stats[pid][19]}")
        todo.extend(children.get(pid, []))
    return found


def reap_when_gone(processes: list[str]):
    if not processes:
        return None
    return subprocess.Popen([sys.executable, "-c", REAPER, *processes], stdin=subprocess.PIPE,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
