"""What each baseline does that the generic backbone checks cannot see: base_wide matched to tensor,
linear attention's chunked form, local's window, xl's segment cache, slots, and registers."""
from __future__ import annotations

import pytest
import torch

from tests.contracts.helpers import HEADS, LAYERS, NAMES, TINY, D, S, build, bump, inputs, query_blocked
from tmem_bench.diagnostics.causality import causality_probe
from tmem_bench.registry import get_backbone


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
