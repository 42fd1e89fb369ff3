"""Train a stored cell again from its settings and compare with the stored result: does this
machine and revision reproduce it? Prints each evaluation level's accuracy (and, where the model
acted in an environment, its mean return), the final train loss and the weights' hash, stored and
retrained, and their wall times (how this machine's speed compares), and exits 1 when any differs.
The hash is compared where the result keeps one; a cell committed without its weights still does.
On the CPU the numbers depend on the thread count too, so it trains at the cell's own.

    python benchmarks/retrain_cell.py docs/runs/study/cells/<id>.json
"""
import argparse
import sys
import tempfile
from pathlib import Path

import torch

from tmem_bench.harness.plan import cell_from_dict
from tmem_bench.harness.results import read_cell, write_weights
from tmem_bench.harness.rundir import sha256
from tmem_bench.harness.train import train_cell


def _compare(what: str, old, new) -> bool:
    print(f"{what}: stored {old!r}, retrained {new!r}")
    return old == new


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cell_file", help="a cell result, cells/<id>.json")
    stored = read_cell(parser.parse_args().cell_file)
    if stored.get("torch_threads"):
        torch.set_num_threads(stored["torch_threads"])
    print(f"torch threads: {torch.get_num_threads()}")
    retrained, model = train_cell(cell_from_dict(stored["cell"]), "cpu")
    same = True
    for old, new in zip(stored["eval"], retrained["eval"]):
        same &= _compare(f"{old['level_key']} accuracy", old["accuracy"], new["accuracy"])
        if "closed_loop" in old:
            same &= _compare(f"{old['level_key']} mean return", old["closed_loop"]["mean_return"],
                             new.get("closed_loop", {}).get("mean_return"))
    same &= _compare("final train loss", stored["history"][-1]["loss"], retrained["history"][-1]["loss"])
    if "weights_sha256" in stored:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "weights.safetensors"
            write_weights(path, model, stored["cell_id"], retrained)
            same &= _compare("weights sha256", stored["weights_sha256"], sha256(path))
    print(f"wall time: stored {stored['wall_time_s']:.0f} s, retrained {retrained['wall_time_s']:.0f} s")
    print(f"scan kernel: stored {stored.get('scan_kernel')}, retrained {retrained.get('scan_kernel')}")
    print("identical" if same else "different")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
