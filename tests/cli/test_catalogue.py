"""`tmem-bench list`: the catalogue, with parameter counts (base_wide matched to tensor)."""
from __future__ import annotations

import pytest

from tests.contracts.helpers import NAMES


def test_list_params_shows_base_wide_matched_to_tensor(capsys):
    if "tensor" not in NAMES:
        pytest.skip("base_wide is matched to `tensor`, which is not registered")
    import re

    from tmem_bench.cli import main
    from tmem_bench.harness.profiles import load_profile

    assert main(["list", "--params"]) == 0
    out = capsys.readouterr().out
    tasks = load_profile("quick")["tasks"]
    gaps = [float(g) for g in re.findall(r"^\s+base_wide\s+[\d,]+\s+\(([+-]\d+\.\d)% vs tensor\)", out, re.M)]
    assert len(gaps) == len(tasks), out
    assert all(abs(g) <= 5.0 for g in gaps), gaps
    for name in NAMES:
        assert re.search(rf"^\s+{name}\s+[\d,]+", out, re.M), f"no parameter count for {name}"
