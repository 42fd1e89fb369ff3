from uuid import uuid4

import pytest
import torch


@pytest.fixture(autouse=True)
def _own_cache_folder(tmp_path_factory, monkeypatch):
    # validate's records and fetched weights: each test's own, never the user's nor another test's
    monkeypatch.setenv("TMEM_BENCH_CACHE", str(tmp_path_factory.getbasetemp() / "tmem-bench-cache" / uuid4().hex))


@pytest.fixture(autouse=True)
def _single_thread_torch():
    # Tests share two cores with each other; one thread each keeps them predictable.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
