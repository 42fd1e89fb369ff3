"""The serial engine: its own class, made and sketched from the options every engine shares."""
from __future__ import annotations

from tmem_bench.harness.executors import ENGINES, Executor, ExecutorOptions, Serial, make_executor, usable


def test_the_serial_engine_is_made_and_sketched_from_its_options():
    o = usable(ExecutorOptions(cpus_per_cell=3))
    made = make_executor(o, None, "cpu")  # the serial engine needs no run directory
    assert type(made) is Serial and made.threads == 3
    sketch = ENGINES["serial"].sketch(o, "cpu")
    assert (sketch.text, sketch.threads, sketch.workers) == ("one after another in this process, 3 thread(s)", 3, 1)
    assert Serial is not Executor and ENGINES["serial"] is Serial  # the registered engine, not the base class
