"""Training-step time of each baseline relative to `base`, measured side by side in one process.

One step is what the harness does: sample a batch, forward through the task
adapter and backbone, cross-entropy, backward, gradient clipping, AdamW. The
models take turns step by step (round robin), so a slow phase of a shared
machine hits all of them alike; each model's time is the median over the
measured rounds after warm-up, and the ratio is that median over base's.

    python benchmarks/bench_baselines.py [OUT.json] [--rounds N] [--warmup N] [--models a,b/key=value,...] [--threads N]

Settings are the paper's reference implementation's (arXiv 2605.27686): coordinate binding W=20 (batch 128, d 64, 2 layers,
4 heads) and, when the task is registered, occlusion L=4 (batch 64, d 96,
3 layers, 4 heads).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from tmem_bench.harness.plan import Cell
from tmem_bench.harness.train import build_model, loss_and_accuracy
from tmem_bench.registry import get_task, task_names

BASELINES = ("base", "base_wide", "slots", "local", "linear", "xl", "registers", "lstm", "delta", "ssm")
SETTINGS = {
    "coordinate_binding": {
        "level": {"n_writes": 20, "noise": 0.05}, "batch_size": 128,
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "dropout": 0.1},
    },
    "occlusion": {
        "level": {"occlusion_len": 4}, "batch_size": 64,
        "model": {"d_model": 96, "n_layers": 3, "n_heads": 4, "dropout": 0.1},
    },
}


def parse_spec(spec: str) -> tuple[str, dict]:
    """"slots/update=recurrent/chunk=1" -> ("slots", {"update": "recurrent", "chunk": 1})."""
    name, *items = spec.split("/")
    options = {}
    for item in items:
        key, _, value = item.partition("=")
        for cast in (int, float, str):
            try:
                options[key] = cast(value)
                break
            except ValueError:
                continue
    return name, options


def make_stepper(task_name: str, spec: str, settings: dict, seed: int = 0):
    task = get_task(task_name)
    model_name, options = parse_spec(spec)
    cell = Cell(
        task=task_name, task_options=task.options(), variant="standard", train_level=settings["level"],
        eval_levels=(settings["level"],), model=model_name, label=spec,
        model_options={**settings["model"], **options}, seed=seed, train={},
    )
    model = build_model(cell)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    generator = torch.Generator().manual_seed(seed)

    def step() -> float:
        start = time.perf_counter()
        batch = task.sample(settings["level"], settings["batch_size"], generator)
        loss, _ = loss_and_accuracy(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return time.perf_counter() - start

    n_params = sum(p.numel() for p in model.parameters())
    return step, n_params


def bench_task(task_name: str, models: list[str], rounds: int, warmup: int) -> dict:
    settings = SETTINGS[task_name]
    steppers = {name: make_stepper(task_name, name, settings) for name in models}
    times = {name: [] for name in models}
    for r in range(warmup + rounds):
        for name, (step, _) in steppers.items():
            t = step()
            if r >= warmup:
                times[name].append(t)
    base = statistics.median(times["base"])
    return {
        "settings": settings,
        "models": {
            name: {
                "median_s": statistics.median(times[name]),
                "ratio_to_base": statistics.median(times[name]) / base,
                "n_params": steppers[name][1],
                "times_s": times[name],
            }
            for name in models
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="benchmarks/results/baselines.json")
    parser.add_argument("--rounds", type=int, default=15, help="measured steps per model (default 15)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps per model first (default 3)")
    parser.add_argument("--models", help="comma-separated models, each NAME or NAME/KEY=VALUE/... "
                        "(default: the baselines); base is always included")
    parser.add_argument("--tasks", default="coordinate_binding,occlusion", help="comma-separated (default: %(default)s)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    models = args.models.split(",") if args.models else list(BASELINES)
    if "base" not in models:
        models.insert(0, "base")
    registered = set(task_names())
    results = {
        "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.platform(),
        "processor": platform.processor(), "rounds": args.rounds, "warmup": args.warmup, "tasks": {},
    }
    for task_name in args.tasks.split(","):
        if task_name not in registered:
            print(f"{task_name}: not registered, skipped")
            continue
        result = bench_task(task_name, models, args.rounds, args.warmup)
        results["tasks"][task_name] = result
        level = ", ".join(f"{k}={v}" for k, v in result["settings"]["level"].items())
        print(f"\n{task_name} ({level}, batch {result['settings']['batch_size']}, "
              + ", ".join(f"{k} {v}" for k, v in result["settings"]["model"].items()) + ")")
        width = max(12, *(len(name) + 2 for name in result["models"]))
        print(f"  {'model':<{width}}{'params':>10}{'median s/step':>15}{'x base':>8}")
        for name, row in result["models"].items():
            print(f"  {name:<{width}}{row['n_params']:>10,}{row['median_s']:>15.4f}{row['ratio_to_base']:>8.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
