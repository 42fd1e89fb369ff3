"""The backbone contract, checked for every registered backbone (plugins included).

Sizes are tiny so the whole file runs in seconds; S = 16 covers two segments of
`xl` at its default of 8 (so every relative-distance bias is used) and exceeds the
default window of `local`.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tmem_bench.diagnostics import conformance
from tmem_bench.diagnostics.causality import causality_probe
from tmem_bench.errors import UsageError
from tmem_bench.harness.plan import profile_state_lengths
from tmem_bench.registry import BACKBONES, backbone_names, get_backbone

D, LAYERS, HEADS, S = 16, 2, 2, 16
NAMES = backbone_names()
BUILTIN = (
    "base", "base_wide", "slots", "local", "linear", "xl", "registers", "lstm", "delta", "ssm", "tensor", "tensor_local",
)
# Tensor Memory is the slow one: the smallest memory that still exercises every part.
_TINY_MEMORY = {"channels": 2, "grid": 3, "kernel": "eager"}  # eager: compiling the scan costs ~30 s per process
TINY = {"tensor": _TINY_MEMORY, "tensor_local": _TINY_MEMORY, "base_wide": _TINY_MEMORY}


def build(name: str, seed: int = 0, **options) -> nn.Module:
    torch.manual_seed(seed)
    return get_backbone(name, d_model=D, n_layers=LAYERS, n_heads=HEADS, **{**TINY.get(name, {}), **options})


def inputs(batch: int = 2, seq_len: int = S, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, seq_len, D, generator=torch.Generator().manual_seed(seed))


def bump() -> torch.Tensor:
    """A change of one token that LayerNorm cannot remove (a constant shift it would)."""
    return torch.randn(D, generator=torch.Generator().manual_seed(7))


def query_blocked(seq_len: int = S) -> torch.Tensor:
    """The memory-forcing shape: the last 4 positions may not attend to the first half."""
    blocked = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    blocked[-4:, : seq_len // 2] = True
    return blocked


def test_every_agreed_model_is_registered():
    assert set(BUILTIN) <= set(NAMES), sorted(set(BUILTIN) - set(NAMES))


def spec(name: str) -> conformance.Spec:
    return conformance.Spec(d_model=D, n_layers=LAYERS, n_heads=HEADS, seq_len=S, batch=2, options=TINY.get(name, {}),
                            state_lengths=profile_state_lengths())


def passes(check, name: str) -> None:
    result = check(BACKBONES.get(name), spec(name))
    assert result.passed, f"{name}: {result.name}: {result.detail}"


@pytest.mark.parametrize("name", NAMES)
def test_forward_shape_and_finite(name):
    passes(conformance.check_forward, name)


@pytest.mark.parametrize("name", NAMES)
def test_output_ends_in_layernorm(name):
    # A final LayerNorm without affine drift at init: each position has mean 0 and variance 1.
    y = build(name).eval()(inputs())
    assert torch.allclose(y.mean(-1), torch.zeros(2, S), atol=1e-4)
    assert torch.allclose(y.var(-1, unbiased=False), torch.ones(2, S), atol=1e-2)


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_gets_a_gradient(name):
    passes(conformance.check_gradients, name)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("check", [conformance.check_causal, conformance.check_causal_blocked],
                         ids=["free", "blocked"])
def test_causality_probe_passes(name, check):
    passes(check, name)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_under_a_seed(name):
    passes(conformance.check_deterministic, name)


@pytest.mark.parametrize("name", NAMES)
def test_state_size(name):
    if not hasattr(build(name), "state_size"):
        assert name not in BUILTIN, f"built-in backbone {name} must report state_size"
        pytest.skip(f"{name} does not report state_size (optional for plugins)")
    passes(conformance.check_state_size, name)


@pytest.mark.parametrize("name, growth", [
    ("base", "linear"), ("registers", "linear"), ("slots", "linear"), ("base_wide", "linear"), ("tensor", "linear"),
    ("local", "bounded"), ("xl", "bounded"), ("tensor_local", "bounded"),
    ("linear", "constant"), ("lstm", "constant"), ("delta", "constant"), ("ssm", "constant"),
])
def test_state_size_growth(name, growth):
    if name not in NAMES:
        pytest.skip(f"{name} is not registered")
    model = build(name)
    s1, s2, s3 = (model.state_size(n) for n in (256, 512, 1024))
    if growth == "linear":
        assert s3 - s2 == 2 * (s2 - s1) > 0
    elif growth == "bounded":
        assert s1 == s2 == s3 and model.state_size(2) < s1
    else:
        assert model.state_size(1) == s1 == s3


@pytest.mark.parametrize("name", [n for n in BUILTIN if n != "base_wide"])
def test_bad_options_are_rejected(name):
    if name not in NAMES:
        pytest.skip(f"{name} is not registered")
    with pytest.raises(TypeError):
        build(name, no_such_option=1)
    with pytest.raises(ValueError):
        get_backbone(name, d_model=D, n_layers=0, n_heads=HEADS)


@pytest.mark.parametrize("name", [n for n in BUILTIN if n not in ("local", "tensor", "tensor_local")])
def test_a_window_is_refused_where_no_mixer_honours_it(name):
    """A sliding window is opt-in (`windowed`): a model that would ignore it refuses it."""
    if name not in NAMES:
        pytest.skip(f"{name} is not registered")
    with pytest.raises((TypeError, ValueError)):
        build(name, window=4)


def test_unknown_backbone_lists_the_known_ones():
    with pytest.raises(UsageError, match="base"):
        get_backbone("no_such_model", d_model=D, n_layers=LAYERS, n_heads=HEADS)


ATTENTION_ONLY = ("base", "base_wide", "local", "xl", "registers")
WITH_MEMORY = ("slots", "linear", "lstm", "delta", "ssm", "tensor", "tensor_local")


@pytest.mark.parametrize("name", ATTENTION_ONLY + WITH_MEMORY)
def test_memory_forcing_mask_blinds_attention_but_not_memory(name):
    # The last 4 positions may attend only among themselves: the early tokens can reach
    # them only through recurrent state, which `blocked` must never cut.
    if name not in NAMES:
        pytest.skip(f"{name} is not registered")
    model = build(name).eval()
    blocked = torch.zeros(S, S, dtype=torch.bool)
    blocked[-4:, :-4] = True
    x = inputs()
    x2 = x.clone()
    x2[:, 0] += bump()
    change = (model(x, blocked)[:, -4:] - model(x2, blocked)[:, -4:]).abs().max().item()
    if name in ATTENTION_ONLY:
        assert change == 0.0
    else:
        assert change > 1e-4


# The probe must be able to fail: toy backbones that leak in different ways.

class ToyBackbone(nn.Module):
    def __init__(self, mix):
        super().__init__()
        self.proj = nn.Linear(D, D)
        self.mix = mix

    def forward(self, x, blocked=None):
        return self.mix(self.proj(x))


LEAKS = {
    "mean over the sequence": lambda x: x + x.mean(dim=1, keepdim=True),
    "peeks at the last token": lambda x: x + x[:, -1:],
    "peeks one token ahead": lambda x: x + torch.roll(x, -1, dims=1),
    "mixes inside chunks of 4": lambda x: x + x.view(x.shape[0], -1, 4, D).mean(2, keepdim=True).expand(-1, -1, 4, -1).reshape(x.shape),
    "reverse cumulative sum": lambda x: x.flip(1).cumsum(1).flip(1),
}


@pytest.mark.parametrize("leak", LEAKS)
def test_probe_flags_a_leaking_backbone(leak):
    result = causality_probe(ToyBackbone(LEAKS[leak]), D, S)
    assert result["verdict"] == "leaking", result
    assert result["leaking_positions"]


def test_probe_flags_a_leak_in_long_sequences_it_only_samples():
    result = causality_probe(ToyBackbone(LEAKS["peeks at the last token"]), D, 200, max_positions=8)
    assert result["verdict"] == "leaking" and len(result["positions"]) == 8


def test_probe_calls_a_constant_backbone_insensitive():
    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = nn.Parameter(torch.randn(D))

        def forward(self, x, blocked=None):
            return self.bias.expand_as(x)

    assert causality_probe(Constant(), D, S)["verdict"] == "insensitive"


def test_probe_calls_a_causal_toy_causal():
    result = causality_probe(ToyBackbone(lambda x: x.cumsum(1)), D, S)
    assert result["verdict"] == "causal" and result["max_past_change"] == 0.0


def test_probe_flags_the_reference_state_threading():
    # The reference hands layer l's end-of-sequence memory to layer l+1 (PAPER.md).
    if "tensor" not in NAMES:
        pytest.skip("tensor is not registered")
    try:
        model = build("tensor", threading="reference")
    except TypeError:
        pytest.skip("tensor has no `threading` option")
    assert causality_probe(model, D, S)["verdict"] == "leaking"


# Per-model properties the generic tests cannot see.

def test_base_wide_matches_tensor_within_5_percent():
    if "tensor" not in NAMES:
        pytest.skip("base_wide is matched to `tensor`, which is not registered")
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    sizes = [(64, 2, 4, {}), (96, 3, 4, {}), (64, 2, 4, {"grid": 8, "channels": 32}), (D, LAYERS, HEADS, TINY["tensor"])]
    for d, layers, heads, memory in sizes:
        tensor = get_backbone("tensor", d_model=d, n_layers=layers, n_heads=heads, **memory)
        wide = get_backbone("base_wide", d_model=d, n_layers=layers, n_heads=heads, **memory)
        base = get_backbone("base", d_model=d, n_layers=layers, n_heads=heads)
        assert abs(count(wide) - count(tensor)) <= 0.05 * count(tensor), (d, layers, memory)
        assert count(wide) > count(base)


def test_base_wide_build_does_not_shift_the_seed():
    # Building the tensor reference must not consume the seeded stream: base_wide's
    # weights are those of a plain transformer of its width built from the same seed.
    if "tensor" not in NAMES:
        pytest.skip("base_wide is matched to `tensor`, which is not registered")
    from tmem_bench.contracts.transformer import Transformer

    wide = build("base_wide", seed=0)
    torch.manual_seed(0)
    plain = Transformer(wide.config)
    assert all(torch.equal(p, q) for p, q in zip(wide.parameters(), plain.parameters()))


def test_linear_chunked_form_matches_the_recurrence():
    from tmem_bench.baselines.linear import feature_map, linear_attention_chunked, linear_attention_recurrent

    q, k, v = torch.randn(3, 2, 2, 21, 8, generator=torch.Generator().manual_seed(0)).unbind(0)
    q, k = feature_map(q), feature_map(k)
    reference = linear_attention_recurrent(q, k, v)
    for chunk in (1, 4, 16, 32):
        torch.testing.assert_close(linear_attention_chunked(q, k, v, chunk), reference, rtol=1e-5, atol=1e-5)


def test_local_sees_only_its_window():
    model = get_backbone("local", d_model=D, n_layers=1, n_heads=HEADS, window=4).eval()
    x = inputs()
    x2 = x.clone()
    x2[:, 3] += bump()
    changed = (model(x) - model(x2)).abs().amax(dim=(0, 2)) > 1e-4
    assert changed.tolist() == [False] * 3 + [True] * 4 + [False] * (S - 7)


def test_xl_reads_the_previous_segment_without_gradient_through_the_cache():
    model = get_backbone("xl", d_model=D, n_layers=LAYERS, n_heads=HEADS, segment=8).eval()
    x = inputs().requires_grad_()
    y = model(x)
    x2 = x.detach().clone()
    x2[:, 2] += bump()
    assert (model(x2)[:, 8:] - y[:, 8:]).abs().max() > 1e-4  # the next segment reads the cache
    (grad,) = torch.autograd.grad(y[:, 8:].sum(), x)
    assert grad[:, :8].abs().max() == 0  # but no gradient flows back through it
    assert grad[:, 8:].abs().max() > 0


def test_xl_matches_a_segment_by_segment_loop():
    # The one-pass form against the recurrence it stands for: each segment in turn
    # attends to the previous segment's cached layer inputs and to its own prefix.
    import torch.nn.functional as F

    seg = 4
    model = get_backbone("xl", d_model=D, n_layers=LAYERS, n_heads=HEADS, segment=seg).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.rel_bias.normal_()
    x = inputs(seq_len=14)
    B, h, hd = x.shape[0], HEADS, D // HEADS
    caches = [None] * LAYERS
    outs = []
    for start in range(0, x.shape[1], seg):
        y = x[:, start:start + seg]
        for layer, block in enumerate(model.blocks):
            n = y.shape[1]
            mem = caches[layer] if caches[layer] is not None else y[:, :0]
            caches[layer] = y
            ctx = torch.cat([mem, y], dim=1)
            q = block.attn.qkv(block.ln_1(y))[..., :D].view(B, n, h, hd).transpose(1, 2)
            k, v = block.attn.qkv(block.ln_1(ctx))[..., D:].view(B, ctx.shape[1], 2, h, hd).permute(2, 0, 3, 1, 4)
            qpos = torch.arange(n)[:, None] + mem.shape[1]
            dist = qpos - torch.arange(ctx.shape[1])[None, :]
            bias = block.attn.rel_bias[:, dist.clamp(0, 2 * seg - 1)].masked_fill(dist < 0, float("-inf"))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None])
            y = y + block.attn.proj(a.transpose(1, 2).reshape(B, n, D))
            y = y + block.mlp(block.ln_2(y))
        outs.append(model.ln_f(y))
    torch.testing.assert_close(model(x), torch.cat(outs, dim=1), rtol=1e-5, atol=1e-5)


def test_xl_attention_reaches_one_segment_back_per_layer():
    model = get_backbone("xl", d_model=D, n_layers=1, n_heads=HEADS, segment=4).eval()
    x = inputs()
    x2 = x.clone()
    x2[:, 1] += bump()
    changed = (model(x) - model(x2)).abs().amax(dim=(0, 2)) > 1e-4
    assert changed.tolist() == [False] + [True] * 7 + [False] * (S - 8)


@pytest.mark.parametrize("update", ["prefix", "recurrent"])
def test_slots_carry_information_when_attention_is_blocked(update):
    # With every attention edge from the second half to the first removed, only the slots link them.
    model = get_backbone("slots", d_model=D, n_layers=LAYERS, n_heads=HEADS, update=update, chunk=8).eval()
    blocked = torch.zeros(S, S, dtype=torch.bool)
    blocked[8:, :8] = True
    x = inputs()
    x2 = x.clone()
    x2[:, 0] += bump()
    assert (model(x, blocked)[:, 8:] - model(x2, blocked)[:, 8:]).abs().max() > 1e-4
    base = get_backbone("base", d_model=D, n_layers=LAYERS, n_heads=HEADS).eval()
    assert torch.equal(base(x, blocked)[:, 8:], base(x2, blocked)[:, 8:])


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_recurrent_slots_are_causal_and_fully_trained(chunk):
    model = get_backbone("slots", d_model=D, n_layers=LAYERS, n_heads=HEADS, update="recurrent", chunk=chunk)
    for blocked in (None, query_blocked()):
        assert causality_probe(model, D, S, blocked=blocked)["verdict"] == "causal"
    model.eval()
    model(inputs()).pow(2).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_slots_reject_an_unknown_update():
    with pytest.raises(ValueError, match="prefix"):
        get_backbone("slots", d_model=D, n_layers=LAYERS, n_heads=HEADS, update="global")


def test_registers_keep_the_task_mask_on_task_tokens():
    model = get_backbone("registers", d_model=D, n_layers=1, n_heads=HEADS).eval()
    blocked = torch.zeros(S, S, dtype=torch.bool)
    blocked[-1, :-1] = True  # the last token may attend only to itself (and the registers)
    x = inputs()
    x2 = x.clone()
    x2[:, 0] += bump()
    assert torch.equal(model(x, blocked)[:, -1], model(x2, blocked)[:, -1])
    assert not torch.equal(model(x)[:, -1], model(x2)[:, -1])


def test_list_params_shows_base_wide_matched_to_tensor(capsys):
    if "tensor" not in NAMES:
        pytest.skip("base_wide is matched to `tensor`, which is not registered")
    import re

    from tmem_bench.cli import main
    from tmem_bench.harness.plan import load_profile

    assert main(["list", "--params"]) == 0
    out = capsys.readouterr().out
    tasks = load_profile("quick")["tasks"]
    gaps = [float(g) for g in re.findall(r"^\s+base_wide\s+[\d,]+\s+\(([+-]\d+\.\d)% vs tensor\)", out, re.M)]
    assert len(gaps) == len(tasks), out
    assert all(abs(g) <= 5.0 for g in gaps), gaps
    for name in NAMES:
        assert re.search(rf"^\s+{name}\s+[\d,]+", out, re.M), f"no parameter count for {name}"


def test_probe_positions_cover_both_ends_and_reject_too_few():
    from tmem_bench.diagnostics.causality import probe_positions

    positions = probe_positions(500, 10, torch.Generator().manual_seed(0))
    assert len(positions) == 10 and positions[0] == 1 and positions[-1] == 499
    assert probe_positions(6, 10, torch.Generator()) == [1, 2, 3, 4, 5]
    assert probe_positions(S, 32, torch.Generator()) == list(range(1, S))  # the registry tests probe every t
    with pytest.raises(ValueError, match="max_positions"):
        probe_positions(500, 1, torch.Generator())


@pytest.mark.parametrize("name", NAMES)
def test_the_final_norm_is_the_last_child(name):
    """Parameter order sets the summation order of the clipped gradient norm, so moving a
    module changes the bits of every clipped step: the final norm stays last, where it was
    when the committed example runs were made (they reproduce exactly)."""
    children = [n for n, _ in build(name).named_children()]
    if "ln_f" in children:
        assert children[-1] == "ln_f", children
