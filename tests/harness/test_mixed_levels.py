"""Training over a mix of levels (a profile's `mixed_levels`): recorded in each cell's settings and so
in its id, only where it is set; every batch drawn at a level from the range; a killed run resumes to
the same numbers; bad settings refused in one line."""
import pytest

from tests.profiles import tiny_profile
from tmem_bench.errors import UsageError
from tmem_bench.harness import runner
from tmem_bench.harness.plan import Overrides, make_plan

MIXED = "{ axis = \"n_writes\", low = 1 }"


def plan(tmp_path, mixed=MIXED, name="p.toml"):
    (tmp_path / name).write_text(tiny_profile(train={"steps": 4, "mixed_levels": mixed}))
    return make_plan("coordinate_binding", str(tmp_path / name), Overrides())


def test_mixed_levels_are_recorded_in_the_cell_and_its_id_only_where_set(tmp_path):
    [plain] = plan(tmp_path, mixed=None, name="plain.toml")
    [mixed] = plan(tmp_path)
    assert "mixed_levels" not in plain.train
    assert mixed.train["mixed_levels"] == {"axis": "n_writes", "low": 1}
    assert mixed.id != plain.id
    assert {k: v for k, v in mixed.train.items() if k != "mixed_levels"} == plain.train


def test_each_batch_is_drawn_at_a_level_from_low_to_the_level_trained_at(tmp_path, monkeypatch):
    from tmem_bench.harness.train import train_cell
    from tmem_bench.tasks.coordinate_binding import CoordinateBinding
    drawn = []
    sample = CoordinateBinding.sample

    def recording(self, level, batch_size, generator):
        if batch_size == 8:  # the profile's training batch (probes draw 1 and 16)
            drawn.append(level["n_writes"])
        return sample(self, level, batch_size, generator)

    monkeypatch.setattr(CoordinateBinding, "sample", recording)
    (tmp_path / "long.toml").write_text(tiny_profile(train={"steps": 40, "mixed_levels": MIXED}))
    [long] = make_plan("coordinate_binding", str(tmp_path / "long.toml"), Overrides())
    train_cell(long, "cpu")
    assert len(drawn) == 40 and set(drawn) == {1, 2}  # trained at n_writes=2, drawn from 1 and 2


def test_a_killed_mixed_run_resumes_to_the_same_numbers(tmp_path, monkeypatch):
    (tmp_path / "p.toml").write_text(tiny_profile(train={"steps": 4, "seeds": [0, 1], "mixed_levels": MIXED}))
    cells = make_plan("coordinate_binding", str(tmp_path / "p.toml"), Overrides())
    whole = {r["cell_id"]: r for r in runner.run_plan(cells, tmp_path / "whole", device="cpu")}
    real, calls = runner.train_cell, []

    def killed_on_second(cell, *args, **kwargs):
        calls.append(cell.id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(cell, *args, **kwargs)

    monkeypatch.setattr(runner, "train_cell", killed_on_second)
    with pytest.raises(KeyboardInterrupt):
        runner.run_plan(cells, tmp_path / "resumed", device="cpu")
    monkeypatch.setattr(runner, "train_cell", real)
    resumed = {r["cell_id"]: r for r in runner.run_plan(cells, tmp_path / "resumed", device="cpu")}
    for cid, result in whole.items():
        assert [(e["accuracy"], e["loss"]) for e in resumed[cid]["eval"]] == \
            [(e["accuracy"], e["loss"]) for e in result["eval"]]
        assert resumed[cid]["weights_sha256"] == result["weights_sha256"]
        assert [h["loss"] for h in resumed[cid]["history"]] == [h["loss"] for h in result["history"]]


@pytest.mark.parametrize("mixed, says", [
    ("{ axis = \"noise\", low = 1 }", "axis 'noise' of 'coordinate_binding' is not integer-valued"),
    ("{ axis = \"n_items\", low = 1 }", "'coordinate_binding' has no axis 'n_items'"),
    ("{ axis = \"n_writes\", low = 3 }", "low must be between 1 and the level trained at (n_writes=2), got 3"),
])
def test_bad_mixed_levels_are_refused_in_one_line(tmp_path, mixed, says):
    with pytest.raises(UsageError) as e:
        plan(tmp_path, mixed=mixed)
    assert says in str(e.value) and "\n" not in str(e.value)
