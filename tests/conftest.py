import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread_torch():
    # Tests share two cores with each other; one thread each keeps them predictable.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
