"""Slurm job arrays through submitit, with their own options, and the jobs record (`tmem-bench jobs`)
a restarted driver and `--cancel` read."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import time
from dataclasses import dataclass, field

from ...errors import UsageError, positive
from ..rundir import RunDir
from .base import (ENGINES, TICK_S, Executor, ExecutorOptions, Flag, Sketch, engine, failure, first_line,
                   on_a_cluster)

LIVE_SLURM_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED")
CLUSTERS = ("slurm", "local")


def minutes(text: str) -> int:
    """A Slurm time limit (MINUTES, H:MM:SS or D-HH:MM:SS) in whole minutes, at least one."""
    days, _, clock = str(text).rpartition("-")
    parts = clock.split(":")
    try:
        if not days and len(parts) == 1:
            total = float(parts[0])
        elif len(parts) == 3:
            h, m, s = (int(p) for p in parts)
            total = (int(days or 0) * 24 + h) * 60 + m + s / 60
        else:
            raise ValueError
    except ValueError:
        total = -1
    if total < 1:
        raise UsageError(f"--slurm-time {text!r} must be MINUTES, H:MM:SS or D-HH:MM:SS, at least one minute")
    return max(1, round(total))


@dataclass(frozen=True)
class SlurmOptions:
    """The --slurm-* flags, checked as they are made: the command line makes them whichever engine
    runs, so a bad --slurm-time is refused under any."""
    partition: str | None = None
    time: str = "240"  # minutes, H:MM:SS or D-HH:MM:SS
    options: dict = field(default_factory=dict)  # extra sbatch options, KEY -> VALUE
    cluster: str = "slurm"  # "local" runs the jobs as processes here, through submitit

    def __post_init__(self):
        if self.cluster not in CLUSTERS:
            raise UsageError(f"--slurm-cluster {self.cluster!r} is unknown; allowed: {', '.join(CLUSTERS)}")
        minutes(self.time)

    @classmethod
    def from_args(cls, args) -> SlurmOptions:
        return cls(partition=args.slurm_partition, time=args.slurm_time, options=sbatch_options(args.slurm_option),
                   cluster=args.slurm_cluster)

    def given(self) -> list[str]:
        """The flags given that no other engine takes (a time and a cluster always have a value)."""
        return ["--slurm-partition"] * (self.partition is not None) + ["--slurm-option"] * bool(self.options)


def sbatch_options(items: list[str]) -> dict[str, str]:
    """--slurm-option KEY=VALUE items -> extra sbatch options (`account=proj` becomes `--account=proj`)."""
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key or not value:
            raise UsageError(f"--slurm-option {item!r} is malformed; expected KEY=VALUE (for example account=proj)")
        options[key.replace("-", "_")] = value
    return options


@engine
class SubmititJobs(Executor):
    """A job array through submitit: on Slurm, or as processes here with cluster 'local'."""
    name = "slurm"
    summary = "a job array through submitit"
    slots = None
    flags = (Flag("--workers", "array tasks at once", {"type": positive, "metavar": "N"}),
             Flag("--gpus-per-cell", "GPUs each cell gets, whole", {"type": float, "metavar": "N"}),
             Flag("--slurm-partition", "the partition the jobs are submitted to", {"metavar": "NAME"}),
             Flag("--slurm-time", "time limit per cell, MINUTES, H:MM:SS or D-HH:MM:SS (default 240 minutes)",
                  {"default": "240", "metavar": "TIME"}),
             Flag("--slurm-option", "an extra sbatch option (repeatable), e.g. account=proj, qos=high, "
                  "constraint=a100", {"action": "append", "default": [], "metavar": "KEY=VALUE"}),
             Flag("--slurm-cluster", "'local' runs the jobs as processes on this machine through submitit, to "
                  "try a setup", {"default": "slurm", "metavar": "slurm|local"}))
    Options = SlurmOptions
    extra = "submitit"

    def __init__(self, run_dir: RunDir, o: ExecutorOptions):
        import submitit

        slurm: SlurmOptions = o.own
        self.submitit, self.cluster = submitit, slurm.cluster
        # Inside the run directory: Slurm's nodes must see the pickled jobs and write their logs to a
        # filesystem the driver shares, which the run directory has to be anyway.
        self.run_dir = RunDir(run_dir)
        self.folder = self.run_dir.slurm_folder
        self.executor = submitit.AutoExecutor(folder=self.folder, cluster=slurm.cluster)
        self.cpus, self.gpus = o.cpus_per_cell or 1, int(o.gpus_per_cell or 0)
        self.threads = self.cpus
        # Always a time limit and a GPU count: submitit's default limits are a few minutes, and its
        # local executor hides every GPU unless told how many a job gets.
        parameters = {"name": "tmem-bench", "timeout_min": minutes(slurm.time), "nodes": 1,
                      "tasks_per_node": 1, "cpus_per_task": self.cpus, "gpus_per_node": self.gpus}
        if slurm.cluster == "slurm":
            parameters.update(slurm_additional_parameters=dict(slurm.options))
            if slurm.partition:
                parameters["slurm_partition"] = slurm.partition
            if o.workers:
                parameters["slurm_array_parallelism"] = o.workers
        self.executor.update_parameters(**parameters)
        self.submitted: list[dict] = []
        self.earlier = self._live_earlier_jobs()

    @classmethod
    def check(cls, o: ExecutorOptions) -> None:
        if o.gpus_per_cell is not None and not float(o.gpus_per_cell).is_integer():
            raise UsageError(f"--gpus-per-cell must be a whole number with --executor slurm, got {o.gpus_per_cell}")
        super().check(o)
        if o.own.cluster == "slurm" and shutil.which("sbatch") is None:
            raise UsageError("--executor slurm: sbatch is not on PATH here; run the driver on a Slurm login node, "
                             "or add --slurm-cluster local to try the jobs on this machine")

    @classmethod
    def make(cls, o: ExecutorOptions, run_dir, device: str) -> SubmititJobs:
        return cls(run_dir, o)

    @classmethod
    def sketch(cls, o: ExecutorOptions, device: str) -> Sketch:
        return on_a_cluster(cls.name, o)

    def describe(self) -> str:
        where = "Slurm" if self.cluster == "slurm" else "this machine through submitit"
        return f"as a job array on {where} ({self.cpus} CPU(s), {self.gpus} GPU(s) per cell; logs in {self.folder})"

    def map(self, fn, jobs):
        adopted = {job["cell_id"]: self.earlier[job["cell_id"]] for job in jobs if job["cell_id"] in self.earlier}
        fresh = [job for job in jobs if job["cell_id"] not in adopted]
        try:
            handles = self.executor.map_array(fn, fresh) if fresh else []
        except Exception as e:  # noqa: BLE001 - sbatch refused: a partition, account or option it does not know
            raise UsageError(f"the job array was not submitted: {first_line(e)}") from None
        pending = list(zip(handles, fresh))
        for job in jobs:
            if job["cell_id"] in adopted:
                pending.append((self.submitit.SlurmJob(folder=self.folder, job_id=adopted[job["cell_id"]]), job))
        self.submitted += [{"cell": job["cell_id"], "job": h.job_id} for h, job in pending]
        self.earlier = {}
        self.run_dir.write_jobs(self)
        while pending:
            finished = [(h, job) for h, job in pending if h.done()]
            if not finished:
                yield None
                time.sleep(TICK_S)
                continue
            ended = {id(h) for h, _ in finished}
            pending = [(h, job) for h, job in pending if id(h) not in ended]
            for handle, job in finished:
                try:
                    yield job, handle.result()
                except Exception as e:  # noqa: BLE001 - timed out, cancelled, killed, lost its node
                    state = handle.state
                    outcome = failure(job, f"{self.name} job {handle.job_id} ({state}): {e}", str(e))
                    # A cancelled job was stopped on purpose (`tmem-bench jobs --cancel`): not retried.
                    yield job, {**outcome, "retry": not state.startswith("CANCELLED")}

    def _live_earlier_jobs(self) -> dict[str, str]:
        """Cell id -> a job of an earlier driver of this run still queued or running on Slurm: a
        restarted driver waits for it instead of submitting the cell again."""
        try:
            record = read_jobs_record(self.run_dir)
        except UsageError:
            return {}
        if record.get("executor") != self.name or record.get("cluster") != "slurm" or self.cluster != "slurm":
            return {}
        return {r["cell"]: r["job"] for r in job_states(self.run_dir, record)
                if r["state"].split()[0] in LIVE_SLURM_STATES}

    def record(self) -> dict:
        earlier = [{"cell": cell, "job": job} for cell, job in self.earlier.items()]
        return {"cluster": self.cluster, "folder": self.folder.name, "jobs": earlier + self.submitted}

def read_jobs_record(run_dir: RunDir) -> dict:
    """The run's jobs.json, checked; a UsageError naming what is wrong."""
    record = run_dir.jobs()
    problem = _record_problem(record)
    if problem:
        raise UsageError(f"{run_dir.jobs_path} is not a jobs record tmem-bench wrote: {problem}")
    return record


def _record_problem(record) -> str | None:
    if not isinstance(record, dict):
        return f"a JSON object is expected, not {type(record).__name__}"
    if record.get("executor") not in ENGINES:
        return f"executor {record.get('executor')!r} is not one of {', '.join(ENGINES)}"
    driver = record.get("driver")
    if not (isinstance(driver, dict) and isinstance(driver.get("pid"), int) and isinstance(driver.get("host"), str)):
        return "it names no driver (a 'driver' object with its pid and host)"
    if record["executor"] != "slurm":
        return None
    if record.get("cluster") not in CLUSTERS:
        return f"cluster {record.get('cluster')!r} is not one of {', '.join(CLUSTERS)}"
    if not isinstance(record.get("folder"), str):
        return "it names no folder of job files ('folder')"
    jobs = record.get("jobs")
    if not (isinstance(jobs, list) and all(isinstance(j, dict) and isinstance(j.get("cell"), str)
                                           and isinstance(j.get("job"), str) for j in jobs)):
        return "'jobs' must be a list of objects with a 'cell' and a 'job' id"
    return None


def _slurm_command(command: str, run_dir: RunDir) -> None:
    if shutil.which(command) is None:  # submitit would call every job UNKNOWN: none live, none cancelled
        raise UsageError(f"the jobs of {str(run_dir)!r} are Slurm jobs, and Slurm's {command} is not on PATH "
                         "here; run this on a machine of the cluster (a login node)")


def job_states(run_dir: RunDir, record: dict) -> list[dict]:
    """Each recorded job with the scheduler's state of it (the latest job of each cell)."""
    latest = {j["cell"]: j["job"] for j in record.get("jobs", [])}
    return [{"cell": cell, "job": job_id, "state": _state(run_dir, record, job_id)} for cell, job_id in latest.items()]


def _state(run_dir: RunDir, record: dict, job_id: str) -> str:
    if record.get("cluster") == "local":
        try:
            os.kill(int(job_id), 0)
            return "RUNNING"
        except (ProcessLookupError, ValueError):
            return "ENDED"
        except PermissionError:
            return "RUNNING"
    _slurm_command("sacct", run_dir)
    import submitit

    return submitit.SlurmJob(folder=run_dir.path / record["folder"], job_id=job_id).state


def cancel_jobs(run_dir: RunDir, record: dict, rows: list[dict]) -> list[str]:
    """Cancel the live jobs among `rows`; their ids."""
    live = [r["job"] for r in rows if r["state"].split()[0] in LIVE_SLURM_STATES]
    if record.get("cluster") == "local":
        if record["driver"]["host"] != socket.gethostname():
            raise UsageError(f"--cancel: the jobs run on {record['driver']['host']}; cancel them there")
        for job_id in live:
            os.kill(int(job_id), signal.SIGINT)  # as submitit's LocalJob.cancel does
        return live
    _slurm_command("scancel", run_dir)
    import submitit

    for job_id in live:
        submitit.SlurmJob(folder=run_dir.path / record["folder"], job_id=job_id).cancel(check=False)
    return live
