"""Checks a plan passes before anything runs: a model is built and called once per size."""
import torch

from tmem_bench.harness.plan import check_model
from tmem_bench.registry import module_names

BUILDS: list[dict] = []


class _Identity(torch.nn.Module):
    def forward(self, x, blocked=None):
        return x


def counted(**options):
    BUILDS.append(options)
    return _Identity()


def test_a_model_that_passed_its_check_is_not_built_again():
    """Validating a board plans one profile per entry; each model is built and called once."""
    size = {"d_model": 8, "n_layers": 1, "n_heads": 2, "dropout": 0.0}
    BUILDS.clear()
    with module_names(True):  # the test's own factory
        check_model(f"{__name__}:counted", size)
        check_model(f"{__name__}:counted", dict(reversed(size.items())))
        assert BUILDS == [size]
        check_model(f"{__name__}:counted", {**size, "d_model": 16})
    assert len(BUILDS) == 2
