"""Submit: a run's models as entries, all or none, refused where the run is incomplete, diverged, already published or its weights are bad, with slugs that keep the letters of their names."""
from __future__ import annotations

import pytest

from tests.helpers import selection
from tmem_bench.errors import UsageError
from tmem_bench.harness.rundir import RunDir


def test_a_missing_weights_file_at_submit_names_a_rerun_that_trains_it(run):
    from tmem_bench.leaderboard.submit import make_entries

    [final] = selection(run)["searches"][0]["final_cells"]
    RunDir(run).weights_path(final).unlink()
    with pytest.raises(UsageError) as error:
        make_entries(run, "X")
    assert "rerun the run's command" in str(error.value) and "rerun the cell" not in str(error.value)
