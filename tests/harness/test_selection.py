"""The learning-rate choice on validation data: the best validation accuracy, deterministically; where
the best two lrs of a grid are within the margin, both are trained at a second seed and the mean
chooses, elsewhere one seed does."""

import pytest

from tests.harness.helpers import result, second_seed_profile, selection_profile, write_profile
from tmem_bench.harness.plan import plan_run
from tmem_bench.harness.selection import choose, load_margin, one_seed_lr


def test_selection_picks_the_best_validation_accuracy_deterministically(tmp_path):
    search = plan_run("coordinate_binding",
                      write_profile(tmp_path, selection_profile("[1e-3, 3e-3, 1e-2]"))).searches[0]
    a, b, c = search.trials
    results = {a.id: result(a, 0.5), b.id: result(b, 0.7), c.id: result(c, 0.6)}
    record = choose(search, results)
    assert record["chosen_lr"] == 3e-3 and record["at_edge"] is False
    assert record == choose(search, dict(reversed(results.items())))
    assert record["final_cells"] == [f.id for f in search.finals(3e-3)]
    assert [t["accuracy"] for t in record["trials"]] == [0.5, 0.7, 0.6]
    # Ties go to the lower validation loss, then to the smaller lr; a diverged trial ranks last.
    tie = {a.id: result(a, 0.7, 0.9), b.id: result(b, 0.7, 0.8), c.id: result(c, 0.9, status="diverged")}
    assert choose(search, tie)["chosen_lr"] == 3e-3
    edge = {a.id: result(a, 0.7), b.id: result(b, 0.7), c.id: result(c, 0.1)}
    assert choose(search, edge)["chosen_lr"] == 1e-3 and choose(search, edge)["at_edge"] is True
    missing = choose(search, {a.id: result(a, 0.7)})
    assert missing["chosen_lr"] is None and missing["missing"] == [b.id, c.id] and not missing["final_cells"]


def test_the_margin_is_data_beside_the_other_thresholds():
    assert 0 < load_margin() < 1


def test_within_the_margin_a_second_seed_is_planned_and_the_mean_decides(tmp_path):
    (search,) = plan_run("coordinate_binding", second_seed_profile(tmp_path)).searches
    assert search.second_seed == 1 and search.seeds == (1, 2)
    a, b, c = search.trials
    first = {a.id: result(a, 0.50), b.id: result(b, 0.62), c.id: result(c, 0.60)}
    record = choose(search, first, margin=0.05)
    # Seed 0 alone would choose 3e-3; the two within 0.05 of each other wait for seed 1.
    assert record["second_seed_lrs"] == [3e-3, 1e-2] and record["chosen_lr"] is None
    second = search.second_trials([3e-3, 1e-2])
    assert [(x.seed, x.train["lr"]) for x in second] == [(1, 3e-3), (1, 1e-2)]
    assert record["missing"] == [x.id for x in second]
    assert [x.id for x in search.cells_after(record)] == [x.id for x in second]

    both = {**first, second[0].id: result(second[0], 0.40), second[1].id: result(second[1], 0.70)}
    record = choose(search, both, margin=0.05)
    assert record["chosen_lr"] == 1e-2 and record["at_edge"] is True and one_seed_lr(record) == 3e-3
    assert [m["accuracy"] for m in record["second_seed_means"]] == pytest.approx([0.51, 0.65])
    assert record["final_cells"] == [f.id for f in search.finals(1e-2)]
    # The second seed's cell at the lr chosen is a final one: one extra cell, the runner-up's.
    after = search.cells_after(record)
    assert len(after) == 3 and {x.id for x in after} == {second[0].id} | set(record["final_cells"])


def test_outside_the_margin_no_second_seed_is_trained(tmp_path):
    (search,) = plan_run("coordinate_binding", second_seed_profile(tmp_path)).searches
    a, b, c = search.trials
    record = choose(search, {a.id: result(a, 0.50), b.id: result(b, 0.70), c.id: result(c, 0.60)}, margin=0.05)
    assert record["second_seed_lrs"] == [] and "second_trials" not in record
    assert record["chosen_lr"] == 3e-3
    assert [x.id for x in search.cells_after(record)] == record["final_cells"]
    # A diverged runner-up is no close call either.
    record = choose(search, {a.id: result(a, 0.50), b.id: result(b, 0.70), c.id: result(c, 0.69, status="diverged")},
                    margin=0.05)
    assert record["second_seed_lrs"] == [] and record["chosen_lr"] == 3e-3


def test_a_profile_without_it_chooses_on_one_seed_and_keeps_its_records(tmp_path):
    (search,) = plan_run("coordinate_binding", second_seed_profile(tmp_path, second_seed=False)).searches
    assert search.second_seed is None
    a, b, c = search.trials
    record = choose(search, {a.id: result(a, 0.60), b.id: result(b, 0.61), c.id: result(c, 0.1)}, margin=0.05)
    assert record["chosen_lr"] == 3e-3
    assert not {"second_seed", "second_seed_lrs", "second_trials"} & set(record)
