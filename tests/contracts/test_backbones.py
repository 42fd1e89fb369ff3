"""The backbone contract, checked for every registered backbone (plugins included); what is particular
to one baseline is in tests/baselines/, to Tensor Memory in tests/tensor_memory/.

Sizes are tiny so the whole file runs in seconds; S = 16 covers two segments of
`xl` at its default of 8 (so every relative-distance bias is used) and exceeds the
default window of `local`.
"""
from __future__ import annotations

import pytest
import torch

from tests.contracts.helpers import BUILTIN, HEADS, LAYERS, NAMES, TINY, D, S, build, bump, inputs
from tmem_bench.diagnostics import conformance
from tmem_bench.errors import UsageError
from tmem_bench.harness.plan import profile_state_lengths
from tmem_bench.registry import BACKBONES, get_backbone


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




@pytest.mark.parametrize("name", NAMES)
def test_the_final_norm_is_the_last_child(name):
    """Parameter order sets the summation order of the clipped gradient norm, so moving a
    module changes the bits of every clipped step: the final norm stays last, where it was
    when the committed example runs were made (they reproduce exactly)."""
    children = [n for n, _ in build(name).named_children()]
    if "ln_f" in children:
        assert children[-1] == "ln_f", children
