"""Measurements of a model or a task that need no run: the convergence rule (`convergence`), the
causality probe (`causality`), the reach probe (`reach`), the state probe's readout
(`state_probe`), and the conformance checks every backbone and task must pass (`conformance`,
`conformance_tasks`). The harness calls them; they never call the harness."""
