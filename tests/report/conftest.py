import pytest

from tests.report.helpers import full_run
from tmem_bench.report import write_report


@pytest.fixture(scope="package")
def report(tmp_path_factory):
    """The report of full_run's synthetic run (every task, every claim's models), written once for the
    report's tests."""
    run_dir = tmp_path_factory.mktemp("run")
    full_run(run_dir)
    return write_report(run_dir)
