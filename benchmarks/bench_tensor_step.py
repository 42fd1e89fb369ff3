"""One full training step (forward, backward, AdamW) of coordinate binding, side by side.

Models: `base`; Tensor Memory through each scan kernel: native (the C extension),
auto (what the default picks here), compiled (torch.compile'd step) and eager; the
naive twin (nn.Conv3d / F.grid_sample loop); and, with --native-lib, other builds
of `_scan.c` (e.g. for another instruction set) through the same native path. Runs
are interleaved round-robin so that load from other processes hits every model
alike; medians after warm-up are reported, the compiled path's first-call (compile)
time separately, and the fraction of this machine's measured fp32 matmul throughput
each step reaches. With --eval, the no-grad evaluation of the quick profile (its
eval set per level, in train.py's batches) is timed the same way.

Every result records the CPU (model name and vector extensions from /proc/cpuinfo),
the native build's variant (avx512, avx2, sse, generic) and the kernel each row ran;
--save writes it to benchmarks/results/tensor_step_b<batch>_t<threads>_<cpu>_<variant>.json.

    python benchmarks/bench_tensor_step.py --threads 2 --eval --save

A CPU without AVX-512 can be approximated on one that has it: build the AVX2 variant
and cap PyTorch's own kernels (ATen, inductor, oneDNN, MKL) at AVX2 as well:

    gcc -O3 -march=native -mno-avx512f -fopenmp -fno-wrapv -fschedule-insns -fsched-pressure -shared -fPIC \\
        $(python3-config --includes) tmem_bench/tensor_memory/_scan.c -o /tmp/scan_avx2.so
    TMEM_BENCH_NATIVE_LIB=/tmp/scan_avx2.so ATEN_CPU_CAPABILITY=avx2 TORCHINDUCTOR_CPP_MARCH=x86-64-v3 \\
        ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/bench_tensor_step.py --threads 2 --save
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from tmem_bench.contracts.device import eval_chunk
from tmem_bench.contracts.model import TaskModel
from tmem_bench.harness.train import evaluate, loss_and_accuracy
from tmem_bench.registry import get_backbone, get_task
from tmem_bench.tensor_memory import native, torch_scan
from tmem_bench.tensor_memory.naive import naive_twin

RESULTS = Path(__file__).resolve().parent / "results"
# The vector extensions that decide which kernels are fast here.
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile",
                "asimd", "sve")
# Environment variables that cap the instruction set PyTorch's own kernels use (see the docstring).
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "TORCHINDUCTOR_CPP_MARCH", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
            native.LIBRARY_ENV)
# The quick profile's evaluation of coordinate binding (tmem_bench/profiles/quick.toml).
EVAL_LEVELS = (5, 10, 20, 50)
EVAL_SIZE = 1024


def cpu_info() -> dict:
    """The CPU's model name and which of VECTOR_FLAGS it has, from /proc/cpuinfo."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    fields: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    return {"model": fields.get("model name") or platform.processor() or platform.machine(),
            "machine": platform.machine(), "vector_extensions": [f for f in VECTOR_FLAGS if f in flags]}


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


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


def with_setup(step, tile: int, library: str | None):
    """`step` with this row's compiled-path batch tile and native build in place."""
    def run():
        torch_scan.BATCH_TILE = tile
        native.use_library(library)
        step()

    return run


def eval_fn(model: TaskModel, eval_sets):
    """train.evaluate over the quick profile's evaluation sets, as run_cell calls it."""
    def run():
        for eval_batch in eval_sets:
            evaluate(model, eval_batch, torch.device("cpu"))
        model.train()

    return run


def timed_round_robin(fns: dict, repeats: int, limited: dict | None = None, between=None):
    """Warm-up (first) times and per-repeat times of each function, interleaved."""
    first, times = {}, {name: [] for name in fns}
    for name, fn in fns.items():
        t = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - t
    for rep in range(repeats):
        if between:
            between()
        for name, fn in fns.items():
            if limited and name in limited and rep >= limited[name]:
                continue
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return first, times


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
    p.add_argument("--no-eager", action="store_true")
    p.add_argument("--tiles", type=str, default="",
                   help="also time the compiled path at these CPU batch tiles, comma-separated (e.g. 16,64)")
    p.add_argument("--native-lib", type=str, default="",
                   help="also time the native scan from these builds of _scan.c, comma-separated .so paths")
    p.add_argument("--eval", action="store_true",
                   help="also time the quick profile's no-grad evaluation (eval sets of every level) of base, "
                        "auto and the native builds")
    p.add_argument("--eval-all", action="store_true", help="with --eval: of the compiled and eager scans as well")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--save", action="store_true",
                   help="write the JSON to benchmarks/results/tensor_step_b<batch>_t<threads>_<cpu>_<variant>.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    cpu = cpu_info()
    default_library = native.library_path()  # the package's build, or TMEM_BENCH_NATIVE_LIB's
    variant = native.native_variant()
    libraries = {None: default_library}
    for path in (p for p in args.native_lib.split(",") if p):
        native.use_library(path)
        if native.native_library() is None:
            raise SystemExit(f"{path}: {native.native_status()[1]}")
        libraries[f"tensor (native {native.native_variant()}, {Path(path).name})"] = path
    native.use_library(default_library)

    task = get_task("coordinate_binding")
    batch = task.sample({"n_writes": args.n_writes, "noise": 0.05}, args.batch, torch.Generator().manual_seed(0))
    size = dict(d_model=64, n_layers=2, n_heads=4)
    tensor_opts = dict(channels=16, grid=6, chunk_size=1)
    # The native builds are timed one after another, before the PyTorch scans: timed right
    # after the eager step, a build came out slower than the same build timed elsewhere.
    models = {"base": build(task, "base", **size),
              "tensor (native)": build(task, "tensor", **size, **tensor_opts, kernel="native")}
    library_of = {name: default_library for name in models}
    for name, path in libraries.items():
        if name is not None:
            models[name], library_of[name] = build(task, "tensor", **size, **tensor_opts, kernel="native"), path
    for kernel in ["auto", "compiled"] + ([] if args.no_eager else ["eager"]):
        models[f"tensor ({kernel})"] = build(task, "tensor", **size, **tensor_opts, kernel=kernel)
    if not args.no_naive:
        models["naive twin"] = naive_twin(models["tensor (compiled)"])
    tile_of = {name: torch_scan.BATCH_TILE for name in models}
    for tile in (int(t) for t in args.tiles.split(",") if t):
        name = f"tensor (compiled, tile {tile})"
        models[name], tile_of[name] = build(task, "tensor", **size, **tensor_opts, kernel="compiled"), tile
    library_of.update({name: default_library for name in models if name not in library_of})

    def ran(name: str) -> str | None:
        """The scan kernel this row ran, with its native variant."""
        if not name.startswith("tensor"):
            return None
        native.use_library(library_of[name])
        return models[name].backbone.scan_kernel()

    kernel_ran = {name: ran(name) for name in models}
    native.use_library(default_library)
    # The useful work of every Tensor Memory variant is that of the fast path.
    tensor_flops = step_flops(models["tensor (compiled)"], batch)
    flops = {name: step_flops(m, batch) if name == "base" else tensor_flops for name, m in models.items()}
    load_before = os.getloadavg()
    steps = {name: with_setup(step_fn(m, batch), tile_of[name], library_of[name]) for name, m in models.items()}
    rates = []
    first, times = timed_round_robin(steps, args.repeats, {"naive twin": args.naive_repeats},
                                     between=lambda: rates.append(matmul_rate()))
    rate = statistics.median(rates)
    evals = {}
    if args.eval:
        eval_sets = [task.eval_set({"n_writes": w, "noise": 0.05}, EVAL_SIZE)[0] for w in EVAL_LEVELS]
        fns = {name: with_setup(eval_fn(m, eval_sets), tile_of[name], library_of[name])
               for name, m in models.items()
               if name in ("base", "tensor (auto)") or name.startswith("tensor (native")
               or (args.eval_all and name in ("tensor (compiled)", "tensor (eager)"))}
        _, eval_times = timed_round_robin(fns, args.repeats)
        evals = {name: statistics.median(ts) for name, ts in eval_times.items()}
    load_after = os.getloadavg()

    med = {name: statistics.median(ts) for name, ts in times.items()}
    fastest = min(v for name, v in med.items() if name.startswith("tensor"))
    rows = []
    for name in steps:
        rows.append({
            "model": name,
            "kernel_ran": kernel_ran[name],
            "native_library": library_of[name] if name.startswith("tensor (native") else None,
            "median_s": med[name],
            "all_s": times[name],
            "first_step_s": first[name],
            "compile_s": first[name] - med[name] if name == "tensor (compiled)" else None,
            "batch_tile": tile_of[name] if name.startswith("tensor") and "native" not in kernel_ran[name] else None,
            "x_base": med[name] / med["base"],
            "x_fastest_tensor": med[name] / fastest if name.startswith("tensor") else None,
            "naive_over_this": med["naive twin"] / med[name] if "naive twin" in med else None,
            "gflop_per_step": flops[name] / 1e9,
            "fraction_of_matmul_rate": flops[name] / med[name] / (rate * 1e9),
            "eval_s": evals.get(name),
            "eval_x_base": evals[name] / evals["base"] if name in evals else None,
        })
    result = {
        "settings": {"batch": args.batch, "batch_tile": tile_of["tensor (compiled)"], "n_writes": args.n_writes,
                     "n_queries": 4, **size, **tensor_opts, "threads": torch.get_num_threads(),
                     "repeats": args.repeats, "naive_repeats": args.naive_repeats,
                     "eval": {"levels_n_writes": list(EVAL_LEVELS), "eval_size": EVAL_SIZE,
                              "eval_batch": eval_chunk(torch.device("cpu"))} if args.eval else None},
        "cpu": cpu,
        "native_variant": variant,
        "isa_caps": {k: os.environ[k] for k in ISA_CAPS if os.environ.get(k)},
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "matmul_gflops": rate,
        "matmul_gflops_all": rates,
        "rows": rows,
    }
    print(f"{cpu['model']} ({' '.join(cpu['vector_extensions'])}), native variant {variant}, "
          f"caps {result['isa_caps'] or 'none'}")
    print(f"batch {args.batch}, W={args.n_writes}, threads {torch.get_num_threads()}, "
          f"load average {load_before[0]:.1f} -> {load_after[0]:.1f} on {os.cpu_count()} CPUs, "
          f"matmul {rate:.0f} GFLOP/s")
    print(f"{'model':<44}{'ran':>18}{'median s':>10}{'x base':>8}{'x best':>8}{'naive/x':>9}{'first s':>9}"
          f"{'eval s':>8}{'x base':>8}")
    for r in rows:
        nv = f"{r['naive_over_this']:.1f}" if r["naive_over_this"] else "-"
        best = f"{r['x_fastest_tensor']:.2f}" if r["x_fastest_tensor"] else "-"
        ev = f"{r['eval_s']:>8.3f}{r['eval_x_base']:>8.1f}" if r["eval_s"] is not None else ""
        print(f"{r['model']:<44}{r['kernel_ran'] or '-':>18}{r['median_s']:>10.3f}{r['x_base']:>8.1f}{best:>8}"
              f"{nv:>9}{r['first_step_s']:>9.2f}{ev}")
    path = args.json
    if args.save:
        path = RESULTS / f"tensor_step_b{args.batch}_t{torch.get_num_threads()}_{slug(cpu['model'])}_{variant}.json"
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
