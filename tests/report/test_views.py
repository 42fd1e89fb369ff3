"""Which rows a curve is drawn from: the training view and the generalisation view of a per-level sweep."""
import pytest

from tests.report.helpers import NOISES, RunBuilder
from tmem_bench.report import curve_data, generalisation_view, load_run, training_view


def test_generalisation_view_of_a_per_level_sweep(tmp_path):
    # The paper profile: a model per (W, noise), each evaluated on the whole grid and beyond it.
    b = RunBuilder(tmp_path)
    grid = [(w, n) for w in (5, 20, 40) for n in NOISES]

    def acc(trained, evaluated):  # falls with W; a noise mismatch costs 0.1; the training W leaves a trace
        return 0.9 - 0.01 * evaluated[0] - 0.1 * (trained[1] != evaluated[1]) + 0.001 * trained[0]

    for trained in [(w, n) for w in (5, 20) for n in NOISES]:
        b.cell("coordinate_binding", "base", 0, trained, {e: acc(trained, e) for e in grid})
    data = load_run(tmp_path)
    rows_ = generalisation_view(data, "coordinate_binding", "n_writes", 5, {"noise": 0.05})
    assert set(rows_["train_level"]) == {"n_writes=5,noise=0.05"}  # the model trained at the panel's noise
    curves = curve_data(rows_, "n_writes")
    assert curves["series"]["base"]["x"] == [5.0, 20.0, 40.0]
    assert curves["series"]["base"]["mean"] == pytest.approx([acc((5, 0.05), (w, 0.05)) for w in (5, 20, 40)])
    trained = curve_data(training_view(data, "coordinate_binding", {"noise": 0.0}), "n_writes")
    assert trained["series"]["base"]["mean"] == pytest.approx([acc((w, 0.0), (w, 0.0)) for w in (5, 20)])
