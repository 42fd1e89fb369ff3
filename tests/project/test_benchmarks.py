import json
import subprocess
import sys
from pathlib import Path

from tests.harness.helpers import early_stop_text
from tests.helpers import ROOT
from tmem_bench.harness import runner
from tmem_bench.harness.dryrun import fmt_duration
from tmem_bench.harness.plan import make_plan

SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks"


def _cell(run_dir: Path, cell_id: str, seed: int, accuracy: float, loss: float, hardware: str | None = None):
    level = {"n_writes": 5}
    result = {"cell_id": cell_id, "history": [{"step": 1, "loss": loss}],
              "eval": [{"level": level, "level_key": "n_writes=5", "accuracy": accuracy, "chance": 1 / 32,
                        "ceiling": 1.0, "n": 64, "fingerprint": "f" * 64}],
              "cell": {"task": "coordinate_binding", "task_options": {}, "variant": "standard", "train_level": level,
                       "eval_levels": [level], "model": "tensor", "label": "tensor", "model_options": {},
                       "seed": seed, "train": {"steps": 1, "lr": 1e-3}}}
    if hardware:
        result["hardware"] = hardware
    (run_dir / "cells").mkdir(parents=True, exist_ok=True)
    (run_dir / "cells" / f"{cell_id}.json").write_text(json.dumps(result))


def test_compare_runs_counts_identical_cells_and_names_those_that_differ(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for run, loss, acc in ((a, 1.0, 0.5), (b, 1.0 + 1e-9, 0.75)):
        _cell(run, "same", 0, 0.9, 2.0, hardware="CPU A, AVX2" if run == a else "CPU B, AVX512")
        _cell(run, "loss", 1, 0.9, loss)
        _cell(run, "acc", 1, acc, 2.0)
    _cell(a, "only_in_a", 2, 0.1, 1.0)
    proc = subprocess.run([sys.executable, str(SCRIPTS / "compare_runs.py"), str(a), str(b)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"3 cells in both (4 in {a}, 3 in {b})" in out
    assert "hardware not recorded (2); CPU A, AVX2 (1)" in out and "CPU B, AVX512 (1)" in out
    assert "identical to the last bit (every accuracy and logged loss): 1 of 3" in out
    assert "seed 0: 1 of 1 identical" in out and "seed 1: 0 of 2 identical, 1 differ in an accuracy, 1 in" in out
    assert ("differs: acc coordinate_binding [standard] tensor seed 1, lr 0.001: largest accuracy difference "
            "25.00 points") in out
    assert "differs: loss" in out and "the same accuracies, a logged loss differs" in out


def test_compare_runs_refuses_a_directory_without_cells(tmp_path):
    _cell(tmp_path / "a", "x", 0, 0.5, 1.0)
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, str(SCRIPTS / "compare_runs.py"), str(tmp_path / "a"),
                           str(tmp_path / "empty")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"compare_runs: {tmp_path / 'empty'}/cells holds no cell results"


def test_compare_runs_names_a_malformed_cell_file(tmp_path):
    _cell(tmp_path / "a", "x", 0, 0.5, 1.0)
    (tmp_path / "b" / "cells").mkdir(parents=True)
    (tmp_path / "b" / "cells" / "x.json").write_text("{not json")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "compare_runs.py"), str(tmp_path / "a"), str(tmp_path / "b")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"compare_runs: {tmp_path / 'b'}: cell file cells/x.json is unreadable")


def test_profile_cost_prices_a_plan_from_a_runs_own_cell_times(tmp_path):
    """Priced from its own run, a fixed-steps plan costs what its cells took; with early stopping
    its cap is priced from the steps a cell ran, with every check."""
    path = tmp_path / "fixed.toml"
    path.write_text(early_stop_text(30, False).replace('"base"', '"base", "lstm"'))
    results = runner.run_plan(make_plan("no_harm", str(path)), tmp_path / "run", device="cpu")
    script = ROOT / "benchmarks" / "profile_cost.py"
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), str(path), "--workers", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"2 cells, {fmt_duration(sum(r['wall_time_s'] for r in results))} of cell time" in proc.stdout
    assert "at most" not in proc.stdout
    capped = tmp_path / "capped.toml"
    capped.write_text(path.read_text().replace("early_stop = false", "early_stop = true")
                      .replace("steps = 30", "steps = 300"))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), str(capped), "--workers", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "at most about" in proc.stdout, proc.stderr


def test_selection_agreement_counts_the_choices_two_runs_share_by_either_rule(tmp_path):
    def run(name, searches):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "selection.json").write_text(json.dumps({"searches": searches}))
        return str(folder)

    def search(label, accuracies, chosen, second=()):
        trials = [{"lr": lr, "cell_id": f"{label}{lr}", "accuracy": acc, "loss": 1.0, "status": "finished"}
                  for lr, acc in accuracies.items()]
        return {"task": "t", "variant": "v", "label": label, "model": label, "train_level": "w=1",
                "grid": sorted(accuracies), "seeds": [1], "trials": trials, "chosen_lr": chosen, "at_edge": True,
                "final_cells": [], "second_seed_lrs": list(second)}

    a = run("a", [search("x", {1e-3: 0.6, 1e-2: 0.5}, 1e-3), search("y", {1e-3: 0.5, 1e-2: 0.52}, 1e-3, (1e-3, 1e-2))])
    b = run("b", [search("x", {1e-3: 0.7, 1e-2: 0.2}, 1e-3), search("y", {1e-3: 0.53, 1e-2: 0.5}, 1e-3, (1e-3, 1e-2))])
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "selection_agreement.py"
    proc = subprocess.run([sys.executable, str(script), a, b], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "first seed alone: 1 of 2 choices agree" in proc.stdout
    assert "t [v] y @ w=1: 0.01 against 0.001" in proc.stdout
    assert "as chosen: 2 of 2 choices agree" in proc.stdout
    assert "second seed trained in 1 of 2 shared searches" in proc.stdout

    # One run: its second seed, where y's lrs were close (seed 0 alone: 1e-2; seed 1 alone: 1e-3 = the mean's).
    close = search("y", {1e-3: 0.5, 1e-2: 0.52}, 1e-3, (1e-3, 1e-2))
    close["second_trials"] = [{"lr": 1e-3, "accuracy": 0.6}, {"lr": 1e-2, "accuracy": 0.55}]
    proc = subprocess.run([sys.executable, str(script), run("c", [search("x", {1e-3: 0.6}, 1e-3), close])],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "second seed trained in 1 of 2 searches, chosen in 1 of them" in proc.stdout
    assert "first seed alone chooses as the mean of both: 0 of 1\n  t [v] y @ w=1: 0.01 alone, 0.001 by" in proc.stdout
    assert "second seed alone chooses as the mean of both: 1 of 1" in proc.stdout


def test_converged_cells_counts_each_runs_cells_by_the_current_rule(tmp_path):
    """The patience rule read again from each cell's checks, whatever the cell recorded."""
    from tests.report.helpers import RunBuilder, trained

    b = RunBuilder(tmp_path / "run")
    for seed, converged, stopped, ran in ((0, True, "converged", 400), (1, False, "cap", 1500), (2, None, None, None)):
        cid = b.cell("occlusion", "tensor", seed, (2,), {(2,): 0.5})
        path = tmp_path / "run" / "cells" / f"{cid}.json"
        result = json.loads(path.read_text())
        result |= trained(converged)
        result["convergence"] = {"converged": not converged}  # a retired rule's record: not read
        result |= {"stopped": stopped, "steps_run": ran} if stopped else {}
        path.write_text(json.dumps(result))
    proc = subprocess.run([sys.executable, str(SCRIPTS / "converged_cells.py"), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "1 of 2 cells converged (1 more record no verdict), 1 min of cell wall time" in proc.stdout
    assert "| occlusion | tensor | 3 | 1 | 1 | 1 | 150-1,500 | cap 1, converged 1, fixed budget 1 | 0.8 |" in proc.stdout


def test_probe_table_sets_the_best_uncalibrated_read_beside_the_number_and_keeps_only_the_changed(tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    try:
        import probe_table
    finally:
        sys.path.remove(str(SCRIPTS))
    from tmem_bench.harness.probe_run import settle

    def row(cell_id, calibration_reads):
        stored = {"cell_id": cell_id, "label": "linear", "seed": 0, "n_writes": 10, "accuracy": 0.9,
                  "status": "probed", "wall_time_s": 1.0,
                  "readouts": {"attention": {"validation": 0.85, "evaluation": 0.84, "best_step": 1},
                               "rows_linear": {"validation": 0.83, "evaluation": 0.82, "best_step": 1}}}
        return settle(stored, {"format": "kv", "reference": "kv_mixed", "best": 1.0, "readouts": calibration_reads})

    moved = row("a", {"attention": 0.12, "rows_linear": 0.93})  # rows_linear's number, attention's beside it
    kept = row("b", {"attention": 0.95, "rows_linear": 0.93})  # attention calibrated: its number, as before
    earlier = {"rows": [{**moved, "probe_accuracy": 0.84, "readout": "attention"}, kept]}
    lines = probe_table.tables({"rows": [moved, kept]}, earlier, rows=True, changed=True)
    assert len(lines) == 3  # the header, its rule and the one cell whose number moved
    assert "| 84.0% (attention) | 82.0% (rows_linear) | 84.0% (attention; uncalibrated) |" in lines[2]
    assert len(probe_table.tables({"rows": [moved, kept]}, earlier, rows=True)) == 4


def test_retrain_cell_reproduces_a_finished_cell_to_its_weights_hash_and_names_any_difference(finished_run, tmp_path):
    (stored,) = (finished_run / "run" / "cells").glob("*.json")
    result = json.loads(stored.read_text())

    def retrain(changed: dict) -> subprocess.CompletedProcess:
        path = tmp_path / stored.name
        path.write_text(json.dumps(result | changed))
        return subprocess.run([sys.executable, str(SCRIPTS / "retrain_cell.py"), str(path)],
                              capture_output=True, text=True, timeout=300)

    same = retrain({})
    assert same.returncode == 0, same.stdout + same.stderr
    assert f"torch threads: {result['torch_threads']}" in same.stdout  # the cell's own: the numbers depend on it
    assert f"weights sha256: stored {result['weights_sha256']!r}, retrained {result['weights_sha256']!r}" in same.stdout
    assert same.stdout.rstrip().endswith("identical")
    other_weights = retrain({"weights_sha256": "0" * 64})
    assert other_weights.returncode == 1 and other_weights.stdout.rstrip().endswith("different")
    other_accuracy = retrain({"eval": [result["eval"][0] | {"accuracy": 1.0}, *result["eval"][1:]]})
    assert other_accuracy.returncode == 1 and "accuracy: stored 1.0, retrained" in other_accuracy.stdout
