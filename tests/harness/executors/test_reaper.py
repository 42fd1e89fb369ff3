"""The reaper: it ends the processes it was given once its driver is gone, and a killed Ray driver
leaves none of its local Ray's processes behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.harness.executors.helpers import PLUGIN, need, sweep_profile
from tmem_bench.harness.executors.reaper import descendants, reap_when_gone


def _alive(process: str) -> bool:
    pid, start = process.split(":")
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19] == start
    except (OSError, IndexError):
        return False


def test_the_reaper_ends_the_processes_it_was_given_once_the_pipe_closes():
    if not os.path.isdir("/proc"):
        assert descendants(os.getpid()) == [] and reap_when_gone([]) is None
        return
    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                              "import time; time.sleep(60)"])
    try:
        (found,) = [p for p in descendants(os.getpid()) if p.startswith(f"{child.pid}:")]
        reaper = reap_when_gone([found])
        time.sleep(0.5)
        assert child.poll() is None  # nothing is ended while the driver holds the pipe
        reaper.stdin.close()
        reaper.wait(timeout=30)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()


def test_a_killed_ray_driver_leaves_none_of_its_local_rays_processes(tmp_path):
    need("ray")
    (tmp_path / "held_plugin.py").write_text(PLUGIN)
    profile = sweep_profile(tmp_path, '[{ name = "held_plugin:model", label = "held" }]')
    hold = tmp_path / "hold"
    hold.touch()
    command = [sys.executable, "-m", "tmem_bench.cli", "run", "coordinate_binding", "--profile", profile,
               "--level", "n_writes=3", "--seeds", "1", "--device", "cpu", "--out", "run", "--no-report",
               "--executor", "ray", "--cpus-per-cell", "1"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TMEM_TEST_HOLD": str(hold)}
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        driver = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    ray_processes = []
    try:
        deadline = time.monotonic() + 180
        while "running 1 cell(s)" not in log.read_text() and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.2)
        assert driver.poll() is None, log.read_text()
        ray_processes = descendants(driver.pid)
        titles = {Path(f"/proc/{p.split(':')[0]}/cmdline").read_bytes().split(b"\0")[0] for p in ray_processes}
        assert {b"ray::DashboardAgent", b"ray::RuntimeEnvAgent"} <= titles, titles
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=60)
        hold.unlink()
    deadline = time.monotonic() + 60
    while (alive := [p for p in ray_processes if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    for p in alive:  # left for the assertion to name, not on the machine
        os.kill(int(p.split(":")[0]), signal.SIGKILL)
    assert alive == []
