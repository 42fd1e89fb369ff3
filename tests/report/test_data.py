"""A run's stored cells as the report's tables: corrupt, incomplete and missing cells named (from the
manifest, without building a model) while the rest renders."""
import json
import subprocess
import sys

from tests.report.helpers import RunBuilder
from tmem_bench import load_results
from tmem_bench.files import write_json
from tmem_bench.report import write_report
from tmem_bench.report.data import MAX_MISSING_LISTED, load_run


def test_corrupt_and_missing_cells_are_named_and_the_rest_renders(tmp_path):
    b = RunBuilder(tmp_path)
    for seed in range(2):
        b.cell("map_building", "base", seed, (16,), {(16,): 0.7, (32,): 0.6})
    corrupt = b.cell("map_building", "base", 2, (16,), {(16,): 0.7, (32,): 0.6})
    (tmp_path / "cells" / f"{corrupt}.json").write_text('{"cell_id": "x", "cell": ')  # a half-written file
    incomplete = b.cell("map_building", "base", 3, (16,), {(16,): 0.7})
    result = json.loads((tmp_path / "cells" / f"{incomplete}.json").read_text())
    del result["eval"][0]["accuracy"]
    write_json(tmp_path / "cells" / f"{incomplete}.json", result)
    b.manifest(extra=[("0123456789abcdef", None)], described=False)
    report = write_report(tmp_path)
    assert len(report.problems) == 3
    text = report.path.read_text()
    assert "## Problems" in text
    assert f"{corrupt}.json is unreadable" in text and f"{incomplete}.json is incomplete" in text
    assert "cell 0123456789abcdef is planned in manifest.json but" in text and "is missing" in text
    assert "accuracy_map_building_from_horizon16" in report.figures
    assert report.figures["accuracy_map_building_from_horizon16"]["panels"][0]["series"]["base"]["n_seeds"] == [2, 2]
    assert len(load_results(tmp_path)) == 4  # the one-call table still loads the readable cells


def test_missing_cells_are_named_from_the_manifest_without_building_a_model(tmp_path):
    b = RunBuilder(tmp_path)
    b.cell("occlusion", "base", 0, (0,), {(0,): 0.9, (6,): 0.5})
    b.manifest(extra=[("fedcba9876543210", "occlusion tensor @ occlusion_len=0 seed 0")])
    code = (f"import sys; from tmem_bench.report import write_report; r = write_report({str(tmp_path)!r}); "
            f"print(r.problems); print(sorted(m for m in ('torch', 'tmem_bench.harness.plan') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    problems, imported = proc.stdout.strip().splitlines()
    assert imported == "[]"  # no plan or torch: no model is built to name a cell (the registry gives colours only)
    text = (tmp_path / "report.md").read_text()
    assert "cell fedcba9876543210 (occlusion tensor @ occlusion_len=0 seed 0) is planned in manifest.json" in text
    assert "- cells: 1 readable of 2 planned" in text and str(tmp_path) not in text


def test_a_run_under_way_counts_its_missing_cells_by_task_and_model_in_one_line(tmp_path):
    b = RunBuilder(tmp_path)
    b.cell("occlusion", "base", 0, (0,), {(0,): 0.9})
    described = [f"occlusion {label} @ occlusion_len=0 seed {seed}"
                 for label, n in (("base", 4), ("tensor", 8)) for seed in range(1, n + 1)]
    extra = [(f"{i:016x}", d) for i, d in enumerate(described)]
    b.manifest(extra=extra)
    problems = load_run(tmp_path).problems
    assert len(extra) > MAX_MISSING_LISTED
    assert problems == ["12 of 13 planned cells have no file in cells/ yet (rerunning the run's command resumes "
                        "them): occlusion base 4, occlusion tensor 8"]
