"""A resubmission of the study's seven entries into a scratch clone (for benchmarks/clone_growth.sh): new cell files and new weights
(each tensor perturbed: new bytes, the entropy of trained weights), held in the folder or referenced."""
import hashlib
import json
import pathlib
import sys

import safetensors.torch
import torch
root, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
g = torch.Generator().manual_seed(0)
for src in sorted((root / "leaderboard/entries").glob("tmem-bench-study-*")):
    dst = src.parent / (src.name + "-resubmitted")
    (dst / "cells").mkdir(parents=True)
    entry = json.loads((src / "entry.json").read_text())
    entry["name"] += " (resubmitted)"
    weights = {}
    for cid in entry["cells"]:
        cell = json.loads((src / "cells" / f"{cid}.json").read_text())
        cell["wall_time_s"] *= 1.01
        (dst / "cells" / f"{cid}.json").write_text(json.dumps(cell, indent=1, sort_keys=True) + "\n")
        tensors = safetensors.torch.load((src / "cells" / f"{cid}.safetensors").read_bytes())
        new = {k: (v * (1 + 1e-3 * torch.randn(v.shape, generator=g))).to(v.dtype) if v.is_floating_point() else v
               for k, v in tensors.items()}
        blob = safetensors.torch.save(new, metadata={"cell_id": cid})
        rec = {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}
        if mode == "held":
            (dst / "cells" / f"{cid}.safetensors").write_bytes(blob)
        else:
            rec["url"] = f"hf://tmem-bench/weights@v2/study/{cid}.safetensors"
        weights[cid] = rec
    entry["weights"] = weights
    (dst / "entry.json").write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
print(mode, sum(p.stat().st_size for p in (root / "leaderboard/entries").glob("*-resubmitted/**/*") if p.is_file()), "bytes written")
