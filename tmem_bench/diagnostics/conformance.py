"""The checks every backbone must pass before its numbers mean anything (a task's: conformance_tasks).

Each check is a function `check_x(factory, spec) -> CheckResult` that builds what
it needs from the registered factory at the sizes of `spec`, so `tmem-bench
check`, the registry tests and a plugin author's own tests run the same code.
A check never raises: a crash inside the model is a failed check whose detail
names the exception.

A backbone claims a fixed state by setting the class attribute
`fixed_state = True` (the example memory in examples/kv_memory does). Such a
model's `state_size(seq_len)` must then be the same at every length probed (up
to 65,536 tokens, and at the longest sequence any level of a built-in profile
makes); any other model's state size must only be positive and never shrink as
the sequence grows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from .causality import causality_probe

# 65,536: the longest sequence benchmarks/bench_state_size.py measures a state at.
STATE_LENGTHS = (1, 8, 64, 512, 4096, 65536)
TRAIN_STEPS = 3


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class Spec:
    """The sizes the checks build and feed a backbone at: small, so every check runs in seconds on a CPU."""

    d_model: int = 16
    n_layers: int = 2
    n_heads: int = 2
    seq_len: int = 16
    batch: int = 2
    options: dict = field(default_factory=dict)
    # Sequence lengths the state size is asked at: `harness.plan_checks.profile_state_lengths()`
    # adds the longest sequence of the built-in profiles (the CLI's check does).
    state_lengths: tuple[int, ...] = STATE_LENGTHS


def build(factory: Callable, spec: Spec, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return factory(d_model=spec.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads, **spec.options)


def inputs(spec: Spec, seed: int = 1) -> torch.Tensor:
    return torch.randn(spec.batch, spec.seq_len, spec.d_model, generator=torch.Generator().manual_seed(seed))


def query_blocked(seq_len: int) -> torch.Tensor:
    """The memory-forcing shape: the last quarter of positions may not attend to the first half."""
    blocked = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    blocked[-max(1, seq_len // 4):, : seq_len // 2] = True
    return blocked


def guarded(name: str, body: Callable[[], tuple[bool, str]]) -> CheckResult:
    try:
        passed, detail = body()
    except Exception as e:  # noqa: BLE001 - any crash in the model under test is that check's failure
        return CheckResult(name, False, f"raised {type(e).__name__}: {e}")
    return CheckResult(name, passed, detail)


def check_builds(factory: Callable, spec: Spec) -> CheckResult:
    def body():
        model = build(factory, spec)
        if not isinstance(model, nn.Module):
            return False, f"the factory returned {type(model).__name__}, not a torch.nn.Module"
        return True, f"{type(model).__name__}(d_model={spec.d_model}, n_layers={spec.n_layers}, n_heads={spec.n_heads})"
    return guarded("builds", body)


def check_forward(factory: Callable, spec: Spec) -> CheckResult:
    """forward(x (B, S, d), blocked=None | (S, S)) -> finite (B, S, d), in train and eval mode."""
    def body():
        model = build(factory, spec)
        want = (spec.batch, spec.seq_len, spec.d_model)
        for blocked in (None, query_blocked(spec.seq_len)):
            for train in (True, False):
                model.train(train)
                y = model(inputs(spec), blocked=blocked)
                where = f"{'train' if train else 'eval'} mode, blocked={'none' if blocked is None else 'given'}"
                if not isinstance(y, torch.Tensor) or tuple(y.shape) != want:
                    got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
                    return False, f"output {got}, expected {want} ({where})"
                if not torch.isfinite(y).all():
                    return False, f"non-finite output ({where})"
        return True, f"(B, S, d) = {want} in train and eval mode, with and without blocked"
    return guarded("forward", body)


def check_gradients(factory: Callable, spec: Spec) -> CheckResult:
    """Every trainable parameter receives a non-zero gradient from a random loss on the output."""
    def body():
        model = build(factory, spec).eval()  # no dropout: a dropped unit must not hide a dead parameter
        weights = torch.randn(spec.batch, spec.seq_len, spec.d_model, generator=torch.Generator().manual_seed(2))
        (model(inputs(spec)) * weights).sum().backward()
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        dead = [n for n, p in trainable if p.grad is None or not p.grad.abs().sum() > 0]
        if dead:
            return False, f"parameters without gradient: {', '.join(dead)}"
        return True, f"all {len(trainable)} parameter tensors"
    return guarded("gradients", body)


def _probe(factory: Callable, spec: Spec, blocked: torch.Tensor | None) -> tuple[bool, str]:
    model = build(factory, spec)
    result = causality_probe(model, spec.d_model, spec.seq_len, blocked=blocked)
    if not model.training:
        return False, "the probe did not restore train mode"
    detail = f"{result['verdict']} (max change before the perturbed position {result['max_past_change']:.2g})"
    if result["verdict"] == "leaking":
        detail += f"; leaks at t = {', '.join(map(str, result['leaking_positions']))}"
    return result["verdict"] == "causal", detail


def check_causal(factory: Callable, spec: Spec) -> CheckResult:
    return guarded("causal", lambda: _probe(factory, spec, None))


def check_causal_blocked(factory: Callable, spec: Spec) -> CheckResult:
    """Causal also under a task's blocked edges (which may remove attention, never add it)."""
    return guarded("causal_blocked", lambda: _probe(factory, spec, query_blocked(spec.seq_len)))


def check_causal_trained(factory: Callable, spec: Spec) -> CheckResult:
    """Causal after a few AdamW steps, in eval and in train mode, with and without blocked edges:
    a leak gated by a weight that starts at zero, or taken only when `self.training`, passes the
    probe of initial weights in eval mode and shows only here."""
    def body():
        model = build(factory, spec).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        target = torch.randn(spec.batch, spec.seq_len, spec.d_model, generator=torch.Generator().manual_seed(7))
        for step in range(TRAIN_STEPS):
            torch.manual_seed(step)  # the dropout draws
            optimizer.zero_grad()
            (model(inputs(spec, seed=10 + step)) - target).pow(2).mean().backward()
            optimizer.step()
        largest = 0.0
        for train_mode in (False, True):
            for blocked in (None, query_blocked(spec.seq_len)):
                result = causality_probe(model, spec.d_model, spec.seq_len, blocked=blocked, train_mode=train_mode)
                where = f"{result['mode']} mode{'' if blocked is None else ', blocked given'}"
                if result["verdict"] != "causal":
                    detail = f"after {TRAIN_STEPS} AdamW steps, {result['verdict']} in {where}"
                    if result["leaking_positions"]:
                        detail += f" (leaks at t = {', '.join(map(str, result['leaking_positions']))})"
                    return False, detail
                largest = max(largest, result["max_past_change"])
        return True, (f"causal after {TRAIN_STEPS} AdamW steps in eval and train mode, with and without blocked "
                      f"(max change before the perturbed position {largest:.2g})")
    return guarded("causal_trained", body)


def check_deterministic(factory: Callable, spec: Spec) -> CheckResult:
    """The same seed gives the same weights and outputs; different inputs give different outputs."""
    def body():
        a, b = build(factory, spec, seed=3), build(factory, spec, seed=3)
        pa, pb = list(a.named_parameters()), list(b.named_parameters())
        if [n for n, _ in pa] != [n for n, _ in pb]:
            return False, "two builds have different parameter names"
        differing = [n for (n, x), (_, y) in zip(pa, pb) if not torch.equal(x, y)]
        if differing:
            return False, f"seed 3 twice gives different weights: {', '.join(differing)}"
        outputs = []
        for model in (a, b):
            torch.manual_seed(4)  # train mode: dropout draws from the global generator
            outputs.append(model(inputs(spec)))
        if not torch.equal(*outputs):
            return False, "seed 3 twice gives different outputs in train mode"
        if torch.equal(a(inputs(spec, seed=5)), a(inputs(spec, seed=6))):
            return False, "different inputs give the same output"
        return True, "same seed, same weights and outputs"
    return guarded("deterministic", body)


def check_state_size(factory: Callable, spec: Spec) -> CheckResult:
    def body():
        model = build(factory, spec)
        if not callable(getattr(model, "state_size", None)):
            return False, "no state_size(seq_len) -> bytes method"
        lengths = spec.state_lengths
        sizes = [model.state_size(n) for n in lengths]
        shown = ", ".join(f"S={n}: {s}" for n, s in zip(lengths, sizes))
        if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            return False, f"state sizes must be positive integers (bytes): {shown}"
        if sizes != sorted(sizes):
            return False, f"the state shrinks as the sequence grows: {shown}"
        if getattr(model, "fixed_state", False):
            if len(set(sizes)) > 1:
                return False, f"claims fixed_state but its state grows: {shown}"
            return True, f"fixed: {sizes[0]:,} bytes at every length"
        return True, f"{shown} bytes"
    return guarded("state_size", body)


def check_memory_state(factory: Callable, spec: Spec) -> CheckResult:
    """The state probe's hook, where the backbone has one: `memory_state(x)` returns a dict of named
    tensors (B, ...), of the same shapes after any number of tokens, finite; the state depends on
    the writes (a change to the first token changes it); and it is causal, the state after token t
    the same whatever the backbone was run on before, so a hook that reads a sequence kept from the
    last forward (later tokens) fails."""
    def body():
        model = build(factory, spec).eval()
        hook = getattr(model, "memory_state", None)
        if not callable(hook):
            return True, "no memory_state hook: nothing for the state probe to read (attention alone)"
        x = inputs(spec)
        with torch.no_grad():
            state = hook(x)
            if not state:
                return True, "memory_state returns no state: nothing for the state probe to read"
            if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                      for k, v in state.items()):
                return False, f"memory_state returned {type(state).__name__}, not a dict of named tensors"
            shapes = {k: tuple(v.shape) for k, v in state.items()}
            wrong = [f"{k} {s}" for k, s in shapes.items() if len(s) < 2 or s[0] != spec.batch]
            if wrong:
                return False, f"state tensors must be (B={spec.batch}, ...): {', '.join(wrong)}"
            t = spec.seq_len // 2
            shorter = {k: tuple(v.shape) for k, v in hook(x[:, :t]).items()}
            if shorter != shapes:
                return False, f"the state's shapes change with the sequence: {shorter} after {t} tokens, {shapes} after {spec.seq_len}"
            if not all(torch.isfinite(v).all() for v in state.values()):
                return False, "non-finite state"
            changed = x.clone()
            changed[:, 0] += 1.0
            if all(torch.equal(state[k], v) for k, v in hook(changed).items()):
                return False, "the state does not depend on the writes: changing the first token leaves it unchanged"
            # The state after t tokens, asked after forward passes over two sequences that share those
            # t tokens and differ after them: a causal hook reads only the tokens it is given.
            later = torch.cat([x[:, :t], -x[:, t:] + 1.0], 1)
            before = []
            for full in (x, later):
                model(full)
                before.append(hook(full[:, :t]))
            moved = [k for k in shapes if not torch.allclose(before[0][k], before[1][k], atol=1e-6)]
            if moved:
                return False, f"not causal: the state after {t} tokens depends on later tokens ({', '.join(moved)})"
        floats = sum(math.prod(s[1:]) for s in shapes.values())
        return True, (f"{len(shapes)} tensor{'s' * (len(shapes) != 1)} ({floats:,} floats a sequence), "
                      "the same shapes at every length, depends on the writes, causal")
    return guarded("memory_state", body)


def check_parameters(factory: Callable, spec: Spec) -> CheckResult:
    def body():
        model = build(factory, spec)
        count = sum(p.numel() for p in model.parameters())
        if count <= 0:
            return False, "no parameters"
        return True, f"{count:,}"
    return guarded("parameters", body)


CHECKS = (
    check_builds, check_forward, check_gradients, check_causal, check_causal_blocked, check_causal_trained,
    check_deterministic, check_state_size, check_memory_state, check_parameters,
)


def run_checks(factory: Callable, spec: Spec | None = None) -> list[CheckResult]:
    """Every check in turn; when the model cannot even be built the rest are reported as not run."""
    spec = spec or Spec()
    first = check_builds(factory, spec)
    if not first.passed:
        return [first] + [CheckResult(c.__name__.removeprefix("check_"), False, "not run: the model does not build")
                          for c in CHECKS[1:]]
    return [first] + [check(factory, spec) for check in CHECKS[1:]]
