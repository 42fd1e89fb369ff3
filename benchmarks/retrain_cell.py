"""Train a stored cell again from its settings and compare with the stored result: does this
machine and revision reproduce it? Prints each evaluation level's accuracy and the final train
loss, stored and retrained, and their wall times (how this machine's speed compares), and exits 1
when any number differs.

    OMP_NUM_THREADS=1 python benchmarks/retrain_cell.py docs/runs/study/cells/<id>.json
"""
import argparse
import sys

from tmem_bench.harness.plan import cell_from_dict
from tmem_bench.harness.results import read_cell
from tmem_bench.harness.train import run_cell


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cell_file", help="a cell result, cells/<id>.json")
    stored = read_cell(parser.parse_args().cell_file)
    retrained = run_cell(cell_from_dict(stored["cell"]), "cpu")
    same = True
    for old, new in zip(stored["eval"], retrained["eval"]):
        same &= old["accuracy"] == new["accuracy"]
        print(f"{old['level_key']}: stored {old['accuracy']!r}, retrained {new['accuracy']!r}")
    old_loss, new_loss = stored["history"][-1]["loss"], retrained["history"][-1]["loss"]
    same &= old_loss == new_loss
    print(f"final train loss: stored {old_loss!r}, retrained {new_loss!r}")
    print(f"wall time: stored {stored['wall_time_s']:.0f} s, retrained {retrained['wall_time_s']:.0f} s")
    print(f"scan kernel: stored {stored.get('scan_kernel')}, retrained {retrained.get('scan_kernel')}")
    print("identical" if same else "different")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
