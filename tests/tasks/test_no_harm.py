"""No-harm control: a task without an axis."""
from __future__ import annotations

import pytest

from tmem_bench.errors import UsageError
from tmem_bench.registry import get_task


def test_no_harm_has_no_axis():
    task = get_task("no_harm")
    assert task.validate_level({}) == {}
    with pytest.raises(UsageError, match="none"):
        task.validate_level({"n_writes": 5})
