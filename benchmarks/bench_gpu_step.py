"""One full training step (forward, backward, AdamW) of coordinate binding on a GPU, every model side by side.

Models: `base`, every other registered backbone, and Tensor Memory through each scan
kernel (triton, the fused kernel `auto` takes on CUDA; compiled; eager), at three
shapes: (batch 128, 24 tokens), (128, 104) and (1024, 104); 24 and 104 tokens are
coordinate binding at W=20 and W=100. Steps are interleaved round-robin within a
shape and timed with CUDA events (wall clock on the CPU); medians after warm-up,
the first step (compilation included) separately. The slow PyTorch scans run at the
shapes --slow-shapes names only (a step of the eager scan at (1024, 104) takes seconds).

    python benchmarks/bench_gpu_step.py --device cuda --save

--save writes benchmarks/results/gpu_step_<device>_torch<version>.json, naming the GPU
(or CPU), torch, Triton and CUDA versions beside the rows.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from bench_tensor_step import build, cpu_info, slug, step_fn  # the CPU benchmark's, beside this file
from tmem_bench.contracts.device import hardware, resolve_device
from tmem_bench.registry import backbone_names, get_task

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = ((128, 20), (128, 100), (1024, 100))  # (batch, n_writes): 24 and 104 tokens
SIZE = dict(d_model=64, n_layers=2, n_heads=4)
TENSOR = dict(channels=16, grid=6, chunk_size=1)


def timed(fn, device) -> float:
    """Seconds of one call, by CUDA events on a GPU."""
    if device.type != "cuda":
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--repeats", type=int, default=10, help="measured steps per model and shape, after a warm-up")
    p.add_argument("--kernels", default="triton,compiled,eager", help="Tensor Memory's kernels, comma-separated")
    p.add_argument("--slow-shapes", type=int, default=1,
                   help="time the compiled and eager scans at the first this many shapes only")
    p.add_argument("--shapes", type=int, default=len(SHAPES), help="the first this many shapes")
    p.add_argument("--save", action="store_true")
    args = p.parse_args()
    device = resolve_device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # as the harness: fp32 numbers comparable to the CPU's
    task = get_task("coordinate_binding")
    kernels = [k for k in args.kernels.split(",") if k]
    if device.type == "cpu":
        kernels = ["native" if k == "triton" else k for k in kernels]
    others = [n for n in backbone_names() if n != "base" and not n.startswith("tensor")]
    rows = []
    for shape_index, (batch_size, n_writes) in enumerate(SHAPES[:args.shapes]):
        batch = task.sample({"n_writes": n_writes, "noise": 0.05}, batch_size, torch.Generator().manual_seed(0))
        batch = {k: v.to(device) for k, v in batch.items()}
        tokens = task.make_adapter(SIZE["d_model"])(batch).shape[1]
        models = {"base": build(task, "base", **SIZE).to(device)}
        for name in others:
            models[name] = build(task, name, **SIZE).to(device)
        for kernel in kernels:
            if kernel in ("compiled", "eager") and shape_index >= args.slow_shapes:
                continue
            models[f"tensor ({kernel})"] = build(task, "tensor", **SIZE, **TENSOR, kernel=kernel).to(device)
        steps = {name: step_fn(m, batch) for name, m in models.items()}
        first = {name: timed(fn, device) for name, fn in steps.items()}
        times = {name: [] for name in steps}
        for _ in range(args.repeats):
            for name, fn in steps.items():
                times[name].append(timed(fn, device))
        med = {name: statistics.median(ts) for name, ts in times.items()}
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        for name in steps:
            kernel_ran = models[name].backbone.scan_kernel() if name.startswith("tensor") else None
            rows.append({"batch": batch_size, "tokens": tokens, "n_writes": n_writes, "model": name,
                         "kernel_ran": kernel_ran, "median_s": med[name], "all_s": times[name],
                         "first_step_s": first[name], "x_base": med[name] / med["base"]})
            print(f"batch {batch_size:>5} tokens {tokens:>4}  {name:<22}{kernel_ran or '-':>18}"
                  f"{med[name] * 1e3:>10.2f} ms{med[name] / med['base']:>8.2f}x base"
                  f"   first {first[name]:.2f} s", flush=True)
        if peak is not None:
            print(f"peak memory so far {peak / 2**30:.1f} GiB", flush=True)
        del models, steps
    result = {
        "device": hardware(device),
        "cpu": cpu_info(),  # model and vector extensions: the host's, and the numbers' where device is the CPU
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _triton_version(),
        "python": platform.python_version(),
        "settings": {**SIZE, **TENSOR, "repeats": args.repeats, "tf32": False, "kernels": kernels,
                     "timer": "cuda events" if device.type == "cuda" else "perf_counter"},
        "rows": rows,
    }
    if args.save:
        path = RESULTS / f"gpu_step_{slug(hardware(device))[:40]}_torch{torch.__version__.split('+')[0]}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


if __name__ == "__main__":
    main()
