"""The reach probe: under memory forcing attention alone has no path from the evidence to the answer, a
memory has one at initialisation, and attention has one where nothing is blocked."""
import pytest
import torch

from tests.helpers import middle_level
from tmem_bench.contracts.device import to_device
from tmem_bench.contracts.model import TaskModel
from tmem_bench.diagnostics.reach import reach_probe
from tmem_bench.registry import backbone_names, get_backbone, get_task, task_names


# Every memory-forcing variant every registered task declares.
FORCING = [(name, get_task(name).variants[variant]) for name in task_names()
           for variant in get_task(name).memory_forcing]


def _reach(model_name, task_name, options, seed=0, device="cpu"):
    torch.manual_seed(seed)
    task = get_task(task_name, **options)
    model = TaskModel(task.make_adapter(16), get_backbone(model_name, d_model=16, n_layers=2, n_heads=2)).to(device)
    level = middle_level(task)
    batch = to_device(task.sample(level, 4, torch.Generator().manual_seed(seed)), device)
    return reach_probe(model, task, level, batch, seed=seed)


@pytest.mark.parametrize("task_name, options", FORCING)
def test_attention_alone_has_no_path_from_evidence_to_answer_under_memory_forcing(task_name, options):
    reach = _reach("base", task_name, options)
    assert reach["evidence_grad"] == 0.0 and reach["ratio"] == 0.0 and reach["answer_grad"] > 0


@pytest.mark.parametrize("model_name", ["tensor", "linear", "delta", "ssm"])
@pytest.mark.parametrize("task_name, options", FORCING)
def test_a_memory_has_a_path_from_evidence_to_answer_at_initialisation(model_name, task_name, options):
    assert _reach(model_name, task_name, options)["ratio"] > 1e-6


def test_the_reach_probe_sees_attention_paths_where_nothing_is_blocked():
    assert _reach("base", "coordinate_binding", {})["ratio"] > 1e-3
    assert _reach("base", "no_harm", {}) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("model_name", backbone_names())
def test_the_reach_probe_on_cuda_finds_the_path_it_finds_on_the_cpu(model_name):
    # In eval mode, as the probe runs: cuDNN's LSTM takes no backward pass there.
    on_cpu, on_cuda = (_reach(model_name, "coordinate_binding", {}, device=d) for d in ("cpu", "cuda"))
    assert on_cuda["ratio"] == pytest.approx(on_cpu["ratio"], rel=1e-2, abs=1e-6)
