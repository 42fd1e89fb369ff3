"""Profiles to cells and cells to results: planning (`plan`, `plan_checks`), learning-rate
selection (`selection`), training one cell (`train`), the run directory and its files (`rundir`,
`results`), running a plan (`runner`) on an executor (`executors`), the dry run's estimate
(`estimate`, `dryrun`) and the state probe of a run (`probe_run`)."""
