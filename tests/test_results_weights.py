"""A cell's weights file is the same bytes on every run, metadata included."""
from __future__ import annotations

import hashlib
import subprocess
import sys

WRITE = """
import sys
import torch
from pathlib import Path
from tmem_bench.harness.results import load_weights, write_weights
torch.manual_seed(0)
make = lambda: torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
model = make()
result = {"cell": {"model": "base", "label": "base", "seed": 0}, "model_config": {"d_model": 4},
          "tmem_bench_version": "0.1.0", "torch_version": torch.__version__}
path = Path(sys.argv[1])
write_weights(path, model, "0123456789abcdef", result)
again = make()
load_weights(path, again)
assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
"""


def test_weights_with_metadata_are_byte_identical_across_processes(tmp_path):
    # safetensors writes its header from hash maps, in an order that changes between processes
    digests = set()
    for i in range(3):
        path = tmp_path / f"w{i}.safetensors"
        subprocess.run([sys.executable, "-c", WRITE, str(path)], check=True)
        digests.add(hashlib.sha256(path.read_bytes()).hexdigest())
    assert len(digests) == 1
