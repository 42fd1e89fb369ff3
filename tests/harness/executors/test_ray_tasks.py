"""Ray tasks, on a real local Ray: the serial engine's numbers, and a Ray the caller started left running."""
from __future__ import annotations

import pytest

from tests.harness.executors.helpers import need, numbers, quiet
from tmem_bench.harness.executors import ENGINES, ExecutorOptions
from tmem_bench.harness.runner import run_plan


@pytest.fixture(scope="module")
def local_ray():
    ray = need("ray")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_ray_tasks_give_the_serial_numbers(sweep, local_ray, tmp_path):
    folder, cells, reference = sweep
    console = quiet()
    run_plan(cells, tmp_path / "run", device="cpu", console=console,
             executor=ExecutorOptions(kind="ray", cpus_per_cell=1))
    assert numbers(tmp_path / "run") == reference
    assert "as Ray tasks on a local Ray (1 CPU(s), 0 GPU(s) per cell)" in console.file.getvalue()
    assert local_ray.is_initialized()  # a Ray the caller started is left to the caller


def test_the_dry_run_of_ray_leaves_the_wall_time_to_the_cluster():
    sketch = ENGINES["ray"].sketch(ExecutorOptions(kind="ray", cpus_per_cell=2), "cpu")
    assert (sketch.text, sketch.threads, sketch.workers) == ("--executor ray (2 CPU(s) per cell)", 2, None)
