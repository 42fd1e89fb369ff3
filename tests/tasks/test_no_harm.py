"""No-harm control: a counting sequence without an axis, its scored positions, its sizes."""
from __future__ import annotations

import pytest
import torch

from tmem_bench.errors import UsageError
from tmem_bench.registry import get_task


def test_no_harm_has_no_axis():
    task = get_task("no_harm")
    assert task.validate_level({}) == {}
    with pytest.raises(UsageError, match="none"):
        task.validate_level({"n_writes": 5})


@pytest.mark.parametrize("seq_len,vocab", [(32, 16), (5, 3), (20, 7)])
def test_no_harm_counts_up_and_scores_every_position_but_the_last(seq_len, vocab):
    task = get_task("no_harm", seq_len=seq_len, vocab=vocab)
    batch = task.sample({}, 8, torch.Generator().manual_seed(0))
    tokens = batch["tokens"]
    assert tokens.shape == (8, seq_len)
    assert torch.equal((tokens[:, 1:] - tokens[:, :-1]) % vocab, torch.ones(8, seq_len - 1, dtype=tokens.dtype))
    assert torch.equal(batch["target"], tokens[:, 1:]) and torch.equal(task.oracle({}, batch), batch["target"])
    h = torch.randn(8, seq_len, 16)
    assert task.make_adapter(16).head(h, batch).shape == (8, seq_len - 1, vocab)


def test_no_harm_refuses_impossible_sizes():
    for options, needle in (({"seq_len": 1}, "seq_len"), ({"vocab": 1}, "vocab"),
                            ({"seq_len": 32, "positions": 8}, "positions")):
        with pytest.raises(UsageError, match=needle):
            get_task("no_harm", **options)
