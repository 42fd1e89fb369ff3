import pytest

# The helpers assert too; pytest rewrites their asserts as a test's.
pytest.register_assert_rewrite("tests.harness.executors.helpers")
