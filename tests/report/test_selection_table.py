"""The learning-rate selection as the report shows it: the note beside an lr chosen at the grid's edge."""


def test_a_choice_among_tied_trials_is_not_called_an_edge():
    from tmem_bench.report.selection_table import lr_note
    tied = {"trials": [{"lr": lr, "accuracy": 0.246, "status": "finished"} for lr in (1e-3, 1e-2)], "at_edge": True}
    assert lr_note(tied) == " (every lr ties)"
    tied["trials"][0]["accuracy"] = 0.25
    assert lr_note(tied) == " (edge)"
    assert lr_note({**tied, "at_edge": False}) == ""
