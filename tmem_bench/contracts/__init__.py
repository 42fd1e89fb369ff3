"""The contracts every part of the suite is written against: a task (`task`), the transformer
every model is built from (`transformer`), a memory beside attention (`memory`) or in its place
(`recurrent`), the model a task's adapter and a backbone make together (`model`), and where a
cell computes (`device`). Tasks, models and the harness import from here; nothing here imports
them."""
