"""The dry run's estimate: the plan's rows and counts, the arithmetic and scheduling with fixed costs
(early-stopping cells at their cap, with every check), a real measurement that scales with steps."""
from dataclasses import asdict

import pytest
import torch

from tests.harness.helpers import EVERY, finish, tiny_cell
from tmem_bench.harness.dryrun import fmt_levels
from tmem_bench.harness.estimate import Affine, Cost, MeasuredCost, estimate, plan_rows
from tmem_bench.harness.plan import Overrides, plan_run
from tmem_bench.harness.rundir import RunDir


class FixedCost:
    """A meter with the same cost for every cell: the estimate's arithmetic without measuring."""

    def __init__(self, setup_s=1.0, step_s=0.01, eval_s=2.0):
        self.value = Cost(setup_s, step_s, eval_s)
        self.asked = []

    def cost(self, cell):
        self.asked.append(cell.id)
        return self.value


@pytest.fixture(scope="module")
def quick_plan():
    # Two variants; --level trains one model per level in each.
    return plan_run("coordinate_binding", "quick",
                    Overrides(models=["base"], levels={"n_writes": [5, 10]}, seeds=[0, 1], steps=100))


def test_rows_count_every_cell_by_model_and_levels(quick_plan, tmp_path):
    rows = plan_rows(quick_plan.cells, quick_plan.searches, None)
    assert sum(len(r.cells) for r in rows) == len(quick_plan.cells) == 2 * 2 * 2
    assert [(r.variant, r.label, r.kind, r.seeds, r.steps, len(r.cells)) for r in rows] == [
        ("standard", "base", "cells", [0, 1], 100, 4), ("block_queries=True", "base", "cells", [0, 1], 100, 4)]
    assert fmt_levels(rows[0].levels) == "n_writes=5,10 noise=0.05"
    assert all(r.finished == 0 for r in rows)
    finish(tmp_path, quick_plan.cells[0])
    (tmp_path / "cells" / f"{quick_plan.cells[1].id}.json").write_text("{torn")  # trained again: not finished
    rows = plan_rows(quick_plan.cells, quick_plan.searches, tmp_path)
    assert [r.finished for r in rows] == [1, 0]


def test_a_cell_without_its_weights_counts_as_the_run_counts_it(quick_plan, tmp_path):
    # The run trains it again unless --keep-weightless keeps its result; the estimate must agree.
    finish(tmp_path, quick_plan.cells[0], weights=False)
    finish(tmp_path, quick_plan.cells[1])
    (tmp_path / "cells" / f"{quick_plan.cells[1].id}.safetensors").write_bytes(b"changed")
    assert [r.finished for r in plan_rows(quick_plan.cells, quick_plan.searches, tmp_path)] == [0, 0]
    assert [r.finished for r in plan_rows(quick_plan.cells, quick_plan.searches, tmp_path, keep_weightless=True)] == [1, 0]
    assert RunDir(tmp_path).unfinished(quick_plan.cells, say=lambda _: None) == quick_plan.cells
    assert len(RunDir(tmp_path).unfinished(quick_plan.cells, say=lambda _: None, keep_weightless=True)) == 7


def test_levels_with_their_own_steps_are_rows_of_their_own(quick_plan):
    cells = [c if c.train_level["n_writes"] == 5 else c.__class__(**{**asdict(c), "train": {**c.train, "steps": 400},
                                                                    "eval_levels": c.eval_levels})
             for c in quick_plan.cells if c.variant == "standard"]
    rows = plan_rows(cells)
    assert [(fmt_levels(r.levels), r.steps, len(r.cells)) for r in rows] == [
        ("n_writes=5 noise=0.05", 100, 2), ("n_writes=10 noise=0.05", 400, 2)]


def test_learning_rate_selection_is_trials_and_finals(tmp_path):
    plan = plan_run("coordinate_binding", "study", Overrides(models=["base"]))
    rows = plan_rows(plan.cells, plan.searches, tmp_path)
    trials = [r for r in rows if r.kind == "trials"]
    finals = [r for r in rows if r.kind == "finals"]
    grid = sorted({c.train["lr"] for s in plan.searches for c in s.trials})
    assert len(grid) > 1 and plan.searches
    assert sum(len(r.cells) for r in trials) == len(grid) * len(plan.searches)
    assert sum(len(r.cells) for r in finals) == sum(len(s.seeds) for s in plan.searches)
    assert all(r.lrs == grid and r.seeds == [0] for r in trials)
    assert all(r.seeds == [1, 2] for r in finals)
    # Finals at whichever lr was chosen count as finished.
    search = plan.searches[0]
    for cell in search.finals(grid[-1]):
        finish(tmp_path, cell)
    finish(tmp_path, search.trials[0])
    rows = plan_rows(plan.cells, plan.searches, tmp_path)
    assert sum(r.finished for r in rows if r.kind == "finals") == len(search.seeds)
    assert sum(r.finished for r in rows if r.kind == "trials") == 1


def test_estimate_arithmetic_and_schedule(quick_plan, tmp_path):
    meter = FixedCost()
    rows = plan_rows(quick_plan.cells, quick_plan.searches, None)
    serial = estimate(rows, meter, workers=1)
    per_cell = 1.0 + 100 * 0.01 + 2.0
    assert serial.remaining == 8 and serial.total_s == pytest.approx(8 * per_cell)
    assert serial.wall_s == pytest.approx(8 * per_cell)
    assert estimate(rows, meter, workers=2).wall_s == pytest.approx(4 * per_cell)
    assert estimate(rows, meter, workers=3).wall_s == pytest.approx(3 * per_cell)  # 8 cells: 3 + 3 + 2
    cluster = estimate(rows, meter, workers=None)
    assert cluster.wall_s is None and cluster.longest_s == pytest.approx(per_cell)
    finish(tmp_path, quick_plan.cells[0])
    assert estimate(plan_rows(quick_plan.cells, [], tmp_path), meter, 1).remaining == 7


def test_finals_wait_for_their_trials():
    plan = plan_run("coordinate_binding", "study_converge", Overrides(models=["base"], steps=100))
    rows = plan_rows(plan.cells, plan.searches)
    per_cell = 1.0 + 100 * 0.01 + 2.0
    n_first, n_finals = len(plan.cells), sum(len(s.seeds) for s in plan.searches)
    workers = n_first + n_finals  # enough for every cell at once, were there no later stages
    # The study's second selection seeds wait for the trials, and the finals for them (in
    # study_converge; `study` itself has no second seeds).
    assert estimate(rows, FixedCost(), workers).wall_s == pytest.approx(3 * per_cell)


def test_estimate_scales_with_steps():
    short = plan_run("coordinate_binding", "quick", Overrides(models=["base"], steps=10)).cells
    long = plan_run("coordinate_binding", "quick", Overrides(models=["base"], steps=1010)).cells
    meter = MeasuredCost(torch.device("cpu"), threads=1)
    a = estimate(plan_rows(short), meter, 1)
    measured = meter.measured
    b = estimate(plan_rows(long), meter, 1)
    assert meter.measured == measured > 0  # the same shapes: measured once
    steps = [meter.cost(c).step_s for c in long]
    assert all(s > 0 for s in steps)
    assert b.total_s - a.total_s == pytest.approx(1000 * sum(steps))


def test_affine_fit():
    assert Affine.fit([(8, 0.5), (32, 1.1)]) == Affine(pytest.approx(0.3), pytest.approx(0.025))
    assert Affine.fit([(8, 1.2), (32, 1.1)]) == Affine(0.0, 1.1 / 32)  # noise: proportional
    assert Affine(0.3, 0.025)(128) == pytest.approx(3.5)
    # Between two lengths on a power law: quadratic from 10 to 40 gives 4x at 20.
    mid = Affine.between(20, 10, Affine(0.0, 1.0), 40, Affine(0.0, 16.0))
    assert mid == Affine(0.0, pytest.approx(4.0))


def test_only_the_shortest_and_longest_lengths_are_measured():
    plan = plan_run("coordinate_binding", "quick", Overrides(models=["base"], levels={"n_writes": [5, 10, 20]},
                                                             steps=10))
    cells = [c for c in plan.cells if c.variant == "standard"]
    meter = MeasuredCost(torch.device("cpu"), threads=1)
    meter.prepare(cells)
    lengths = sorted(meter.seq_len(c, c.train_level) for c in cells)
    estimate(plan_rows(cells), meter, 1)
    key = next(iter(meter.train_at))
    assert {n for (*k, n) in meter.step if tuple(k) == key} == set(lengths)
    # Steps: two lengths timed, the middle one interpolated; forward passes likewise.
    assert meter.measured == 4
    middle = meter.step[(*key, lengths[1])]
    low, high = meter.step[(*key, lengths[0])], meter.step[(*key, lengths[2])]
    assert min(low(64), high(64)) <= middle(64) <= max(low(64), high(64))


class FixedCheckedCost:
    def cost(self, cell):
        return Cost(setup_s=1.0, step_s=0.01, eval_s=2.0, check_s=0.5)


def test_the_estimate_counts_an_early_stopping_cell_at_its_cap_and_every_check(tmp_path):
    cell = tiny_cell(tmp_path, steps=305)
    (row,) = plan_rows([cell])
    assert row.early_stop and row.steps == 305
    est = estimate([row], FixedCheckedCost(), workers=1)
    checks_run = 1 + 305 // EVERY + 1  # step 0, every EVERY steps, and the cap
    assert est.total_s == pytest.approx(1.0 + 305 * 0.01 + checks_run * 0.5 + 2.0)
    fixed = estimate(plan_rows([tiny_cell(tmp_path, steps=305, early_stop=False)]), FixedCheckedCost(), workers=1)
    assert fixed.total_s == pytest.approx(1.0 + 305 * 0.01 + 2.0)


def _quick_cells(**kw):
    plan = plan_run("coordinate_binding", "quick", Overrides(models=["base"], steps=10, **kw))
    return [c for c in plan.cells if c.variant == "standard"]


def test_a_second_estimate_reads_the_stored_timings_and_measures_nothing(tmp_path):
    from tmem_bench.harness.timings import Timings

    cells, path = _quick_cells(), tmp_path / "timings.json"
    first = MeasuredCost(torch.device("cpu"), threads=1, timings=Timings("this machine", path))
    a = estimate(plan_rows(cells), first, 1)
    first.timings.save()
    assert first.measured > 0 and first.timings.reused == 0
    again = MeasuredCost(torch.device("cpu"), threads=1, timings=Timings("this machine", path))
    b = estimate(plan_rows(cells), again, 1)
    assert again.measured == 0 and again.timings.reused > 0 and again.build == first.build
    assert b.total_s == pytest.approx(a.total_s)
    # Another machine (or thread count, or version) has a table of its own: measured there.
    other = MeasuredCost(torch.device("cpu"), threads=1, timings=Timings("another machine", path))
    estimate(plan_rows(cells), other, 1)
    assert other.measured == first.measured and other.timings.reused == 0


def test_another_batch_size_is_measured_not_read(tmp_path):
    from tmem_bench.harness.timings import Timings

    path = tmp_path / "timings.json"
    first = MeasuredCost(torch.device("cpu"), threads=1, timings=Timings("m", path))
    estimate(plan_rows(_quick_cells()), first, 1)
    first.timings.save()
    again = MeasuredCost(torch.device("cpu"), threads=1, timings=Timings("m", path))
    estimate(plan_rows(_quick_cells(batch_size=16)), again, 1)
    assert again.measured > 0  # the sizes a step is timed at follow the batch


@pytest.mark.parametrize("text", ["{not json", '{"m": {"x": 1}}', "[1, 2]", '{"m": 3}'])
def test_an_unreadable_or_edited_timings_file_is_measured_anew(tmp_path, text):
    import json

    from tmem_bench.harness.timings import Timings

    path = tmp_path / "timings.json"
    first = MeasuredCost(torch.device("cpu"), threads=1, timings=Timings("m", path))
    estimate(plan_rows(_quick_cells()), first, 1)
    first.timings.save()
    stored = json.loads(path.read_text())
    # every stored value edited to something that is not a timing: each is measured again
    edited = {"m": {key: ("x" if i % 2 else [-1, float("nan")]) for i, key in enumerate(stored["m"])}}
    for content in (text, json.dumps(edited)):
        path.write_text(content)
        again = MeasuredCost(torch.device("cpu"), threads=1, timings=Timings("m", path))
        estimate(plan_rows(_quick_cells()), again, 1)
        assert again.measured == first.measured
