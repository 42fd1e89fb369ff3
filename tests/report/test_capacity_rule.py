"""The capacity claim reads the attention reference and the memory-off accuracy; saturation names the
reference it read and is not testable where attention is blind by construction; throughput is given per
task, the claim's first. On synthetic cells (nothing is trained here)."""
import json

import pytest

from tests.report.helpers import CHANCE, RunBuilder, trained
from tmem_bench.report import check_claim, load_run
from tmem_bench.report.stats import NOT_TESTABLE, SUPPORTED

C = CHANCE["coordinate_binding"]
WS = (5, 20, 40)
FORCING = "block_queries=True"


def run(run_dir, tensor, tensor_off, base, variant="standard", blind_base=False, base_wide=None):
    """tensor, its memory off and base (and base_wide where given): {W: accuracy}, each trained at each W,
    three seeds a little apart, every cell converged."""
    b = RunBuilder(run_dir)
    for seed in range(3):
        for w in WS:
            level = (w, 0.0)
            jitter = 0.005 * (seed - 1)
            cells = [b.cell("coordinate_binding", "tensor", seed, level, {level: tensor[w] + jitter}, variant=variant,
                            memory_off={level: tensor_off[w] + jitter}, gates={"layer0": 0.7, "layer1": 0.6})]
            for model, accuracies in (("base", base), ("base_wide", base_wide)):
                if accuracies is None:
                    continue
                cid = b.cell("coordinate_binding", model, seed, level, {level: accuracies[w] + jitter},
                             variant=variant)
                cells.append(cid)
                if blind_base:
                    patch(run_dir, cid, reach={"init": {"ratio": 0.0}, "trained": {"ratio": 0.0}})
            for cid in cells:
                patch(run_dir, cid, **trained(True))
    b.manifest()
    return load_run(run_dir)


def patch(run_dir, cell_id, **fields):
    path = run_dir / "cells" / f"{cell_id}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


HOLDS = {5: 0.97, 20: 0.92, 40: 0.85}
AT_CHANCE = {w: C for w in WS}


def test_a_memory_that_adds_what_attention_and_its_memory_off_lack_supports_capacity(tmp_path):
    claim = check_claim(run(tmp_path, HOLDS, AT_CHANCE, AT_CHANCE, variant=FORCING), "capacity")
    assert claim.verdict == SUPPORTED, claim.reason
    assert claim.evidence[0]["attention and memory off at the largest W"].startswith("n_writes=40: base 3.1%")


@pytest.mark.parametrize("off, base, says", [
    (HOLDS, AT_CHANCE, "with its memory off tensor still does it at n_writes=40: 85.0% against 85.0% on"),
    (AT_CHANCE, HOLDS, "attention alone does it at n_writes=40: base 85.0%"),
])
def test_a_memory_off_or_a_reference_as_high_does_not_support_capacity(tmp_path, off, base, says):
    claim = check_claim(run(tmp_path, HOLDS, off, base), "capacity")
    assert claim.verdict == NOT_TESTABLE, claim.reason
    assert claim.reason.startswith(f"tensor: {NOT_TESTABLE} ({says}")


def test_a_memory_below_the_papers_accuracy_is_refuted_whatever_attention_does(tmp_path):
    falls = {5: 0.97, 20: 0.60, 40: 0.40}
    assert check_claim(run(tmp_path, falls, falls, falls), "capacity").verdict == "not supported"


def test_saturation_names_the_reference_it_read(tmp_path):
    claim = check_claim(run(tmp_path, {5: 0.97, 20: 0.80, 40: 0.60}, AT_CHANCE, {5: 0.45, 20: 0.44, 40: 0.44},
                            base_wide={5: 0.46, 20: 0.40, 40: 0.30}), "saturation")
    # base_wide drops most (16 points): the reason names it, never base.
    assert "base_wide (the growing-state reference that drops most) +16.0" in claim.reason, claim.reason


def test_saturation_is_not_testable_where_attention_is_blind_by_construction(tmp_path):
    data = run(tmp_path, {5: 0.97, 20: 0.80, 40: 0.60}, AT_CHANCE, AT_CHANCE, variant=FORCING, blind_base=True)
    claim = check_claim(data, "saturation")
    assert claim.notes == [f"under the variant {FORCING} (not in the paper) the same rule gives: {NOT_TESTABLE}"]
    assert "attention is blind by construction here" in claim.evidence[0]["why"]
    # A reference at chance with a path to the writes has learned nothing, which more steps may change.
    data = run(tmp_path / "path", {5: 0.97, 20: 0.80, 40: 0.60}, AT_CHANCE, AT_CHANCE, variant=FORCING)
    assert check_claim(data, "saturation").notes == [
        f"under the variant {FORCING} (not in the paper) the same rule gives: inconclusive"]


def test_throughput_is_given_per_task_with_the_claims_task_first(tmp_path):
    b = RunBuilder(tmp_path)
    for seed in range(2):
        for model, gated, rate in (("base", False, 20.0), ("tensor", True, 4.0)):
            gates = {"layer0": 0.5, "layer1": 0.5} if gated else None
            b.cell("occlusion", model, seed, (0,), {(0,): 0.9}, gates=gates, steps_per_s=rate)
            b.cell("coordinate_binding", model, seed, (5, 0.0), {(5, 0.0): 0.9}, gates=gates,
                   steps_per_s=rate if model == "tensor" else 4.4)
    b.manifest()
    claim = check_claim(load_run(tmp_path), "throughput")
    assert claim.reason.endswith("over 2 task(s): coordinate_binding 1.1x, occlusion 5.0x")
    assert [e["task"] for e in claim.evidence] == ["coordinate_binding", "occlusion"]
