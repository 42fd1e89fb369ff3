"""Inference state against sequence length: Tensor Memory's fixed state beside base's KV cache.

For each length: the bytes one sequence carries between tokens (`state_size`) for
`base` (the KV cache), `tensor` (KV cache plus one memory state per layer),
`tensor_local` (the window's KV cache plus the memory) and the memory alone; and,
up to --measure-max tokens, the measured peak resident memory of streaming the
sequence through one Tensor Memory layer in segments (state carried across
segments, batch 1, no gradients), each length in a fresh process.

    python benchmarks/bench_state_size.py --json benchmarks/results/state_size.json
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

LENGTHS = [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000]


def stream(seq_len: int, segment: int) -> dict:
    """Run in a child process: peak RSS of streaming `seq_len` tokens through one memory."""
    import torch

    from tmem_bench.tensor_memory import TensorMemory, TensorMemoryConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    memory = TensorMemory(TensorMemoryConfig(d_model=64, channels=16, grid=6, kernel="eager")).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        state = memory.init_state(1)
        memory(torch.randn(1, segment, 64, generator=g), state)  # warm-up: allocator and kernels
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        done = 0
        while done < seq_len:
            n = min(segment, seq_len - done)
            _, state = memory(torch.randn(1, n, 64, generator=g), state)
            done += n
        elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_rss_kib": after, "peak_rss_growth_kib": after - before, "seconds": elapsed,
            "state_bytes": sum(t.numel() * t.element_size() for t in state)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--measure-max", type=int, default=8_000, help="longest sequence to stream and measure")
    p.add_argument("--segment", type=int, default=1024)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(stream(args.child, args.segment)))
        return

    from tmem_bench.registry import get_backbone

    size = dict(d_model=64, n_layers=2, n_heads=4)
    base, tensor, local = (get_backbone(n, **size) for n in ("base", "tensor", "tensor_local"))
    memory_bytes = tensor.memory.state_size()
    rows = []
    for seq_len in LENGTHS:
        row = {
            "seq_len": seq_len,
            "base_kv_bytes": base.state_size(seq_len),
            "tensor_bytes": tensor.state_size(seq_len),
            "tensor_local_bytes": local.state_size(seq_len),
            "memory_state_bytes_per_layer": memory_bytes,
            "measured": None,
        }
        if seq_len <= args.measure_max:
            out = subprocess.run([sys.executable, __file__, "--child", str(seq_len), "--segment", str(args.segment)],
                                 capture_output=True, text=True, check=True)
            row["measured"] = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)

    print(f"{'tokens':>8}{'base KV':>12}{'tensor':>12}{'tensor_local':>14}{'TM state/layer':>16}"
          f"{'stream peak RSS':>17}{'RSS growth':>12}{'stream s':>10}")
    for r in rows:
        m = r["measured"]
        measured = (f"{m['peak_rss_kib'] / 1024:>15.1f}M{m['peak_rss_growth_kib'] / 1024:>11.1f}M{m['seconds']:>10.1f}"
                    if m else f"{'-':>16}{'-':>12}{'-':>10}")
        print(f"{r['seq_len']:>8}{r['base_kv_bytes'] / 2**20:>11.2f}M{r['tensor_bytes'] / 2**20:>11.2f}M"
              f"{r['tensor_local_bytes'] / 2**10:>13.1f}K{r['memory_state_bytes_per_layer'] / 2**10:>15.1f}K{measured}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"settings": {**size, "channels": 16, "grid": 6, "segment": args.segment},
                                         "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
