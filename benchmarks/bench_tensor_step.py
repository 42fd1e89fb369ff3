"""One full training step (forward, backward, AdamW) of coordinate binding, side by side.

Models: `base`; Tensor Memory through each scan kernel: native (the C extension,
the CPU default), compiled (torch.compile'd step) and eager; and the naive twin
(nn.Conv3d / F.grid_sample loop). Runs are interleaved round-robin so that load
from other processes hits every model alike; medians after warm-up are reported,
the compiled path's first-call (compile) time separately, and the fraction of
this machine's measured fp32 matmul throughput each step reaches.

    python benchmarks/bench_tensor_step.py --threads 2 --json benchmarks/results/tensor_step_b128_t2.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from naive_tensor_memory import naive_twin  # noqa: E402
from tmem_bench import tm_fast  # noqa: E402
from tmem_bench.model import TaskModel  # noqa: E402
from tmem_bench.registry import get_backbone, get_task  # noqa: E402
from tmem_bench.train import loss_and_accuracy  # noqa: E402


def matmul_rate(n: int = 1024, repeats: int = 7) -> float:
    """Median fp32 GFLOP/s of an n x n matmul on this machine, now."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times) / 1e9


def build(task, name: str, d_model: int, n_layers: int, n_heads: int, **options) -> TaskModel:
    torch.manual_seed(0)
    return TaskModel(task.make_adapter(d_model), get_backbone(name, d_model, n_layers, n_heads, **options))


def step_fn(model: TaskModel, batch):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)

    def step():
        loss, _ = loss_and_accuracy(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def with_tile(step, tile: int):
    def run():
        tm_fast.BATCH_TILE = tile
        step()

    return run


def step_flops(model: TaskModel, batch) -> int:
    """Matmul/conv FLOPs of one forward+backward, counted by torch's FlopCounterMode."""
    counter = FlopCounterMode(display=False)
    with counter:
        loss, _ = loss_and_accuracy(model, batch)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--n-writes", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5, help="measured steps per model (after one warm-up)")
    p.add_argument("--naive-repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--no-naive", action="store_true")
    p.add_argument("--tiles", type=str, default="",
                   help="also time the compiled path at these CPU batch tiles, comma-separated (e.g. 16,64)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)

    task = get_task("coordinate_binding")
    batch = task.sample({"n_writes": args.n_writes, "noise": 0.05}, args.batch, torch.Generator().manual_seed(0))
    size = dict(d_model=64, n_layers=2, n_heads=4)
    tensor_opts = dict(channels=16, grid=6, chunk_size=1)
    models = {
        "base": build(task, "base", **size),
        "tensor (native)": build(task, "tensor", **size, **tensor_opts, kernel="native"),
        "tensor (compiled)": build(task, "tensor", **size, **tensor_opts, kernel="compiled"),
        "tensor (eager)": build(task, "tensor", **size, **tensor_opts, kernel="eager"),
    }
    if not args.no_naive:
        models["naive twin"] = naive_twin(models["tensor (eager)"])
    tile_of = {name: tm_fast.BATCH_TILE for name in models}
    for tile in (int(t) for t in args.tiles.split(",") if t):
        name = f"tensor (compiled, tile {tile})"
        models[name], tile_of[name] = build(task, "tensor", **size, **tensor_opts, kernel="compiled"), tile
    # The useful work of every Tensor Memory variant is that of the fast path.
    tensor_flops = step_flops(models["tensor (eager)"], batch)
    flops = {name: step_flops(m, batch) if name == "base" else tensor_flops for name, m in models.items()}
    load_before = os.getloadavg()
    steps = {name: with_tile(step_fn(m, batch), tile_of[name]) for name, m in models.items()}

    first = {}
    for name, step in steps.items():  # warm-up; the compiled model compiles here
        t = time.perf_counter()
        step()
        first[name] = time.perf_counter() - t
    times = {name: [] for name in steps}
    rates = []
    for rep in range(args.repeats):
        rates.append(matmul_rate())
        for name, step in steps.items():
            if name == "naive twin" and rep >= args.naive_repeats:
                continue
            t = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t)
    load_after = os.getloadavg()
    rate = statistics.median(rates)

    med = {name: statistics.median(ts) for name, ts in times.items()}
    rows = []
    for name in steps:
        rows.append({
            "model": name,
            "median_s": med[name],
            "all_s": times[name],
            "first_step_s": first[name],
            "compile_s": first[name] - med[name] if name == "tensor (compiled)" else None,
            "batch_tile": tile_of[name] if name.startswith("tensor") and "native" not in name else None,
            "x_base": med[name] / med["base"],
            "naive_over_this": med["naive twin"] / med[name] if "naive twin" in med else None,
            "gflop_per_step": flops[name] / 1e9,
            "fraction_of_matmul_rate": flops[name] / med[name] / (rate * 1e9),
        })
    result = {
        "settings": {"batch": args.batch, "batch_tile": tile_of["tensor (compiled)"], "n_writes": args.n_writes, "n_queries": 4, **size, **tensor_opts,
                     "threads": torch.get_num_threads(), "repeats": args.repeats, "naive_repeats": args.naive_repeats},
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "matmul_gflops": rate,
        "matmul_gflops_all": rates,
        "rows": rows,
    }
    print(f"batch {args.batch}, W={args.n_writes}, threads {torch.get_num_threads()}, "
          f"load average {load_before[0]:.1f} -> {load_after[0]:.1f} on {os.cpu_count()} CPUs, "
          f"matmul {rate:.0f} GFLOP/s")
    print(f"{'model':<20}{'median s':>10}{'x base':>9}{'naive/x':>9}{'first s':>9}{'GFLOP':>8}{'of peak':>9}")
    for r in rows:
        nv = f"{r['naive_over_this']:.1f}" if r["naive_over_this"] else "-"
        print(f"{r['model']:<20}{r['median_s']:>10.3f}{r['x_base']:>9.1f}{nv:>9}{r['first_step_s']:>9.2f}"
              f"{r['gflop_per_step']:>8.1f}{r['fraction_of_matmul_rate']:>9.1%}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
