from __future__ import annotations

import pytest
import torch

from tests.harness.executors.helpers import numbers, quiet, sweep_profile
from tmem_bench.harness.executors import ExecutorOptions
from tmem_bench.harness.plan import Overrides, make_plan
from tmem_bench.harness.runner import run_plan


@pytest.fixture(scope="package")
def sweep(tmp_path_factory):
    """The plan's folder, its four cells, and the serial executor's numbers for them, which every
    other executor must give."""
    folder = tmp_path_factory.mktemp("sweep")
    profile = sweep_profile(folder)
    cells = make_plan("coordinate_binding", profile, Overrides(train_at="each"))
    threads = torch.get_num_threads()
    # One thread per cell under every executor: CPU numbers are identical for the same thread count.
    run_plan(cells, folder / "serial", device="cpu", console=quiet(), executor=ExecutorOptions(cpus_per_cell=1))
    assert torch.get_num_threads() == threads  # the driver's own setting is left as it was
    reference = numbers(folder / "serial")
    assert len(cells) == 4 and set(reference) == {c.id for c in cells}
    return folder, cells, reference
