"""`delta` and `ssm`: each chunked op against its token-by-token twin, the state they carry, their size.

Equivalence is measured as the largest absolute difference over the largest
reference magnitude, per tensor: float64 separates the formula from rounding,
float32 is what training runs.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tmem_bench.baselines import delta as delta_module
from tmem_bench.baselines import ssm as ssm_module
from tmem_bench.baselines.delta import DeltaTransformer, gated_delta_chunked, gated_delta_recurrent
from tmem_bench.baselines.ssm import SSMTransformer, ssd_chunked, ssd_recurrent
from tmem_bench.registry import get_backbone
from tmem_bench.tensor_memory.params import n_params, tensor_params

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}
CHUNKS = (1, 4, 5, 16, 32)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


def delta_inputs(B, H, S, K, V, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    q = F.normalize(randn(B, H, S, K), dim=-1) * K ** -0.5
    k = F.normalize(randn(B, H, S, K), dim=-1)
    g = -F.softplus(randn(B, H, S))
    beta = torch.sigmoid(randn(B, H, S))
    return q, k, randn(B, H, S, V), g, beta, randn(B, H, K, V)


def ssd_inputs(b, H, S, P, N, shared, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    groups = 1 if shared else H
    B, C = randn(b, groups, S, N), randn(b, groups, S, N)
    return randn(b, H, S, P), -F.softplus(randn(b, H, S)), B, C, randn(b, H, P, N)


def compare(chunked, recurrent, inputs, dtype) -> dict[str, float]:
    """Errors of the chunked op against the recurrence: outputs, final state, and the gradient of
    every input (the initial state included) under one random weighting of both outputs."""
    errors, grads = {}, []
    for op in (chunked, recurrent):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out, state = op(*leaves[:-1], initial_state=leaves[-1])
        gen = torch.Generator().manual_seed(9)
        loss = (out * torch.randn(out.shape, generator=gen, dtype=dtype)).sum() \
            + (state * torch.randn(state.shape, generator=gen, dtype=dtype)).sum()
        grads.append((out.detach(), state.detach(), *torch.autograd.grad(loss, leaves)))
    for i, (got, want) in enumerate(zip(*grads)):
        errors[("output", "state")[i] if i < 2 else f"grad{i - 2}"] = rel_err(got, want)
    return errors


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(2, 3, 21, 8, 6), (1, 2, 7, 16, 16), (3, 1, 33, 4, 8)])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_gated_delta_chunked_matches_the_recurrence(shape, chunk, dtype):
    inputs = delta_inputs(*shape, dtype)
    errors = compare(lambda *a, **kw: gated_delta_chunked(*a, chunk, **kw), gated_delta_recurrent, inputs, dtype)
    assert max(errors.values()) < TOLERANCE[dtype], errors


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape, shared", [
    ((2, 3, 21, 8, 6), True), ((1, 2, 7, 16, 16), False), ((3, 1, 33, 4, 8), True),
])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_ssd_chunked_matches_the_recurrence(shape, shared, chunk, dtype):
    inputs = ssd_inputs(*shape, shared, dtype)
    errors = compare(lambda *a, **kw: ssd_chunked(*a, chunk, **kw), ssd_recurrent, inputs, dtype)
    assert max(errors.values()) < TOLERANCE[dtype], errors


OPS = {
    "delta": (gated_delta_chunked, gated_delta_recurrent, lambda: delta_inputs(2, 2, 9, 4, 4, torch.float64)),
    "ssm": (ssd_chunked, ssd_recurrent, lambda: ssd_inputs(2, 2, 9, 4, 3, True, torch.float64)),
}


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("chunk", [4, 16])
def test_zero_initial_state_and_no_final_state(name, chunk):
    # Without an initial state the ops start from zero; without a final state the reads are unchanged.
    chunked, recurrent, make = OPS[name]
    *inputs, initial = make()
    want, want_state = recurrent(*inputs, torch.zeros_like(initial))
    got, got_state = chunked(*inputs, chunk)
    assert rel_err(got, want) < 1e-12 and rel_err(got_state, want_state) < 1e-12
    for start in (None, initial):
        reads, none = chunked(*inputs, chunk, initial_state=start, output_final_state=False)
        assert none is None and torch.equal(reads, chunked(*inputs, chunk, initial_state=start)[0])


MODELS = {  # the module, its chunked op, and the recurrence standing in for it (the chunk ignored)
    "delta": (delta_module, "gated_delta_chunked", lambda *args, **_: gated_delta_recurrent(*args[:5])),
    "ssm": (ssm_module, "ssd_chunked", lambda *args, **_: ssd_recurrent(*args[:4])),
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_model_matches_its_naive_twin(name, chunk, monkeypatch):
    # The whole backbone, its layers running the chunked op, against the same weights running the recurrence.
    torch.manual_seed(0)
    model = get_backbone(name, d_model=16, n_layers=2, n_heads=2, chunk=chunk).double().eval()
    x = torch.randn(2, 11, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    runs = []
    for twin in (False, True):
        if twin:
            module, op, recurrent = MODELS[name]
            monkeypatch.setattr(module, op, recurrent)
        model.zero_grad()
        y = model(x)
        (y * torch.linspace(-1, 1, 16, dtype=torch.float64)).sum().backward()
        runs.append([y.detach()] + [p.grad.clone() for p in model.parameters()])
    for got, want in zip(*runs):
        assert rel_err(got, want) < 1e-12


def delta_step(mixer, x, state, cache):
    """One token through a GatedDeltaNet from what it carries: S per head and the last conv inputs."""
    B, D = x.shape
    h = mixer.n_heads
    window = torch.cat([cache, mixer.qkv(x)[:, None]], dim=1)  # (B, kernel, 3d)
    q, k, v = F.silu(mixer.conv(window)[:, -1]).view(B, 3, h, 1, D // h).unbind(1)  # (B, h, 1, hd)
    a, b = mixer.decay_and_strength(x).view(B, 2, h, 1).unbind(1)
    g = -mixer.A_log.exp()[:, None] * F.softplus(a + mixer.dt_bias[:, None])
    q = F.normalize(q, dim=-1) * (D // h) ** -0.5
    o, state = gated_delta_recurrent(q, F.normalize(k, dim=-1), v, g, torch.sigmoid(b), state)
    o = mixer.norm(o[:, :, 0]) * F.silu(mixer.gate(x)).view(B, h, -1)
    return mixer.proj(o.reshape(B, D)), state, window[:, 1:]


def ssm_step(mixer, x, state, cache):
    """One token through a Mamba2 from what it carries: H per head and the last conv inputs."""
    B = x.shape[0]
    h = mixer.n_heads
    z, xBC, dt = mixer.in_proj(x).split(mixer.sizes, dim=-1)
    window = torch.cat([cache, xBC[:, None]], dim=1)  # (B, kernel, d_inner + 2 d_state)
    u, Bm, Cm = F.silu(mixer.conv(window)[:, -1]).split(mixer.conv_sizes, dim=-1)
    u = u.view(B, h, 1, -1)
    dt = F.softplus(dt + mixer.dt_bias)[:, :, None]  # (B, h, 1)
    a = -mixer.A_log.exp()[:, None] * dt
    y, state = ssd_recurrent(u * dt[..., None], a, Bm[:, None, None], Cm[:, None, None], state)
    y = (y + mixer.D[:, None, None] * u).reshape(B, -1)
    return mixer.out_proj(mixer.norm(y * F.silu(z))), state, window[:, 1:]


@pytest.mark.parametrize("name, step", [("delta", delta_step), ("ssm", ssm_step)])
def test_state_size_is_exactly_what_a_token_by_token_run_carries(name, step):
    # Streamed one token at a time, carrying only each layer's state and conv cache, the model
    # gives its full forward's outputs; state_size counts exactly the bytes carried.
    torch.manual_seed(0)
    model = get_backbone(name, d_model=16, n_layers=2, n_heads=2).double().eval()
    x = torch.randn(2, 13, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    # Per layer: the state (None: zero) and the last kernel-1 inputs of the convolution.
    carried = [[None, x.new_zeros(2, b.attn.conv.weight.shape[1] - 1, b.attn.conv.weight.shape[0])]
               for b in model.blocks]
    outs = []
    with torch.no_grad():
        for t in range(x.shape[1]):
            y = x[:, t]  # (B, d)
            for block, carry in zip(model.blocks, carried):
                out, carry[0], carry[1] = step(block.attn, block.ln_1(y), *carry)
                y = y + out
                y = y + block.mlp(block.ln_2(y))
            outs.append(model.ln_f(y))
        assert rel_err(torch.stack(outs, dim=1), model(x)) < 1e-12
    per_sequence = sum(t[0].numel() for carry in carried for t in carry)
    assert model.state_size(1) == model.state_size(13) == model.state_size(100_000) == 4 * per_sequence
    assert model.state_size(13, bytes_per_element=2) == 2 * per_sequence


@pytest.mark.parametrize("name", ["delta", "ssm"])
def test_blocked_is_ignored_and_the_state_carries_the_past(name):
    model = get_backbone(name, d_model=16, n_layers=2, n_heads=2).eval()
    blocked = torch.zeros(16, 16, dtype=torch.bool)
    blocked[-4:, :-4] = True
    x = torch.randn(2, 16, 16, generator=torch.Generator().manual_seed(1))
    x2 = x.clone()
    x2[:, 0] += torch.randn(16, generator=torch.Generator().manual_seed(7))
    assert torch.equal(model(x, blocked), model(x))
    assert (model(x, blocked)[:, -4:] - model(x2, blocked)[:, -4:]).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["delta", "ssm"])
@pytest.mark.parametrize("sizes", [(64, 2, 4), (96, 3, 4), (32, 2, 4), (16, 2, 2)])
def test_parameters_match_tensor_within_5_percent(name, sizes):
    target = tensor_params(*sizes)
    assert abs(n_params(get_backbone(name, *sizes)) - target) <= 0.05 * target


@pytest.mark.parametrize("name, model_class", [("delta", DeltaTransformer), ("ssm", SSMTransformer)])
def test_matching_does_not_shift_the_seed_and_an_explicit_width_wins(name, model_class):
    torch.manual_seed(0)
    matched = get_backbone(name, d_model=16, n_layers=2, n_heads=2)
    torch.manual_seed(0)
    plain = model_class(matched.config)
    assert all(torch.equal(p, q) for p, q in zip(matched.parameters(), plain.parameters()))
    assert get_backbone(name, d_model=16, n_layers=2, n_heads=2, mlp_ratio=4.0).config.mlp_ratio == 4.0
