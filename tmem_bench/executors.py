"""Where the cells of a plan run: in this process, in a local process pool, as Ray tasks or as a
Slurm job array through submitit.

Every executor maps one picklable cell function over plain-data jobs (a cell's settings and the
run directory's path, never a model or a tensor) and yields `(job, outcome)` as cells finish,
and `None` while it waits so that the driver can refresh its display. A worker that dies, a
job the scheduler ends or a lost node becomes a failed outcome here; retries, failure records
and progress are the driver's (runner.py), so every executor behaves the same; the run directory's
files, jobs.json included, are rundir.py's.
"""
from __future__ import annotations

import ctypes
import importlib.util
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .errors import UsageError, check_float, check_int
from .reaper import descendants, reap_when_gone
from .rundir import RunDir

EXECUTORS = ("serial", "local", "ray", "slurm")
EXTRAS = {"ray": "ray", "slurm": "submitit"}  # executor -> the package its extra installs
CLUSTERS = ("slurm", "local")
TICK_S = 0.5
LIVE_SLURM_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED")

Outcome = dict
Step = tuple[dict, Outcome] | None


@dataclass(frozen=True)
class ExecutorOptions:
    kind: str = "serial"
    workers: int | None = None  # local: processes; slurm: array tasks running at once
    address: str | None = None  # ray: an existing cluster; None starts a local Ray
    cpus_per_cell: int | None = None
    gpus_per_cell: float | None = None
    slurm_partition: str | None = None
    slurm_time: str = "240"  # minutes, H:MM:SS or D-HH:MM:SS
    slurm_options: dict = field(default_factory=dict)  # extra sbatch options, KEY -> VALUE
    slurm_cluster: str = "slurm"  # "local" runs the jobs as processes here, through submitit


def usable(options: ExecutorOptions | str | None) -> ExecutorOptions:
    """The options checked, or a UsageError naming what is wrong (including a missing extra)."""
    o = ExecutorOptions(kind=options) if isinstance(options, str) else (options or ExecutorOptions())
    if o.kind not in EXECUTORS:
        raise UsageError(f"--executor {o.kind!r} is unknown; allowed: {', '.join(EXECUTORS)}")
    applies = {
        "--workers": (o.workers is not None, ("local", "slurm")),
        "--address": (o.address is not None, ("ray",)),
        "--gpus-per-cell": (o.gpus_per_cell is not None, ("ray", "slurm")),
        "--slurm-partition": (o.slurm_partition is not None, ("slurm",)),
        "--slurm-option": (bool(o.slurm_options), ("slurm",)),
    }
    for flag, (given, kinds) in applies.items():
        if given and o.kind not in kinds:
            raise UsageError(f"{flag} applies to --executor {' or '.join(kinds)}, not {o.kind}")
    for flag, count in (("--workers", o.workers), ("--cpus-per-cell", o.cpus_per_cell)):
        if count is not None:
            check_int(flag, count)
    if o.gpus_per_cell is not None:
        check_float("--gpus-per-cell", o.gpus_per_cell)
        if o.kind == "slurm" and not float(o.gpus_per_cell).is_integer():
            raise UsageError(f"--gpus-per-cell must be a whole number with --executor slurm, got {o.gpus_per_cell}")
    if o.slurm_cluster not in CLUSTERS:
        raise UsageError(f"--slurm-cluster {o.slurm_cluster!r} is unknown; allowed: {', '.join(CLUSTERS)}")
    minutes(o.slurm_time)
    package = EXTRAS.get(o.kind)
    if package and importlib.util.find_spec(package) is None:
        raise UsageError(f"--executor {o.kind} needs {package}, which is not installed; "
                         f"install it with: pip install \"tmem-bench[{o.kind}]\"")
    if o.kind == "slurm" and o.slurm_cluster == "slurm" and shutil.which("sbatch") is None:
        raise UsageError("--executor slurm: sbatch is not on PATH here; run the driver on a Slurm login node, "
                         "or add --slurm-cluster local to try the jobs on this machine")
    return o


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


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def failure(job: dict, error: BaseException | str, trace: str | None = None) -> Outcome:
    """The outcome of a cell that raised, or whose worker, job or node was lost."""
    if isinstance(error, BaseException):
        trace = trace or "".join(traceback.format_exception(error))
        error = f"{type(error).__name__}: {error}".strip()
    first = str(error).strip().splitlines()
    return {"cell_id": job["cell_id"], "ok": False, "error": first[0] if first else "failed",
            "traceback": trace or str(error), "host": socket.gethostname()}


class Executor:
    """Runs cells in this process, one after another."""
    name = "serial"
    slots: int | None = 1  # cells running at once; None where the cluster decides

    def __init__(self, threads: int | None = None):
        # Torch threads each cell sets; None leaves this process's own. On the CPU a cell's
        # numbers depend on them (sums split among threads round differently), so the same
        # count gives the same numbers under every executor.
        self.threads = threads

    def describe(self) -> str:
        threads = f", {self.threads} thread(s)" if self.threads else ""
        return f"one after another in this process{threads}"

    def map(self, fn: Callable[[dict], Outcome], jobs: list[dict]) -> Iterator[Step]:
        import torch

        before = torch.get_num_threads()
        try:
            for job in jobs:
                yield job, fn(job)
        finally:
            torch.set_num_threads(before)  # the driver's own setting outlives its cells

    def record(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


_started = None  # in a worker of a local pool: where it says which cell it starts


def _init_worker(driver_pid: int, gpus, started) -> None:
    global _started
    _started = started
    if sys.platform.startswith("linux"):
        # A worker dies with its driver: a killed driver leaves no orphan writing into the run directory.
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != driver_pid:
            os._exit(1)
    if gpus is not None:
        # Before anything initialises CUDA in this process, so that it sees its one device as cuda:0.
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpus.get())


def _announced(fn, job: dict):
    """`fn(job)` in a pool worker that first tells the driver its process id and the cell: when a
    worker dies, its pool fails every cell in it, and this names the one that was running there."""
    _started.put((os.getpid(), job["cell_id"]))
    return fn(job)


def _death(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class LocalPool(Executor):
    """A pool of spawned processes on this machine; with GPUs, each worker pinned to one of them."""
    name = "local"

    def __init__(self, workers: int | None, cpus: int | None, gpus: int):
        self.gpus = gpus
        self.workers = self.slots = workers or gpus or available_cores()
        # Unless told, every worker would start a thread per core of the machine, oversubscribing it.
        self.threads = cpus or max(1, available_cores() // self.workers)

    def describe(self) -> str:
        pinned = f", one GPU each of {self.gpus}" if self.gpus else ""
        return f"on a local pool of {self.workers} worker(s), {self.threads} thread(s) each{pinned}"

    def map(self, fn, jobs):
        pending = list(jobs)
        while pending:
            pending = yield from self._until_broken(fn, pending)

    def _until_broken(self, fn, jobs: list[dict]) -> Iterator[Step]:
        """Run `jobs` on a fresh pool. A worker that dies breaks the pool for every cell in it: the
        cell that worker ran fails, and the others are returned, to go on in the next pool."""
        context = multiprocessing.get_context("spawn")
        gpus = None
        if self.gpus:
            gpus = context.SimpleQueue()
            for i in range(self.workers):
                gpus.put(i % self.gpus)
        started = context.SimpleQueue()
        pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_init_worker,
                                   initargs=(os.getpid(), gpus, started))
        futures, processes, broken = {}, {}, []
        try:
            futures = {pool.submit(_announced, fn, job): job for job in jobs}
            while futures:
                done, _ = wait(futures, timeout=TICK_S, return_when=FIRST_COMPLETED)
                processes.update(getattr(pool, "_processes", None) or {})
                if not done:
                    yield None
                for future in done:
                    job = futures.pop(future)
                    try:
                        outcome = future.result()
                    except BrokenProcessPool:
                        broken.append(job)
                        continue
                    except Exception as e:  # noqa: BLE001 - the job or its result could not be pickled
                        outcome = failure(job, e)
                    yield job, outcome
        finally:
            # The driver stopped early (interrupted, or raised): cells still running are abandoned
            # rather than waited for, and a rerun resumes them.
            if futures:
                for process in dict(getattr(pool, "_processes", None) or {}).values():
                    process.terminate()
            # A broken pool is waited for: then every worker's exit code is known.
            pool.shutdown(wait=not futures, cancel_futures=True)
        if not broken:
            return []
        last = {}
        while not started.empty():
            pid, cell_id = started.get()
            last[pid] = cell_id
        # The pool ends the survivors with SIGTERM once one worker died; any other end is the death.
        dead = {last[pid]: p.exitcode for pid, p in processes.items()
                if pid in last and p.exitcode not in (None, -signal.SIGTERM)}
        # A death no worker's cell explains fails every cell it broke, rather than rebuilding forever.
        blamed = [job for job in broken if job["cell_id"] in dead] or broken
        for job in blamed:
            how = _death(dead[job["cell_id"]]) if job["cell_id"] in dead else "a worker of the pool died"
            yield job, failure(job, f"its worker process died ({how}) while running this cell")
        return [job for job in broken if job not in blamed]


class RayTasks(Executor):
    """One Ray task per cell, on the cluster at `address` or on a local Ray started here."""
    name = "ray"
    slots = None

    def __init__(self, address: str | None, cpus: int | None, gpus: float | None):
        import ray

        self.ray, self.address = ray, address
        self.started = not ray.is_initialized()
        self.reaper = None
        if self.started:
            try:
                ray.init(address=address, include_dashboard=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise UsageError(f"--address {address!r}: cannot start or reach Ray: {_first_line(e)}") from None
            if address is None:
                self.reaper = reap_when_gone(descendants(os.getpid()))
        self.cpus, self.gpus = cpus or 1, gpus or 0
        # Ray gives each task one thread by default (OMP_NUM_THREADS=1): the cell sets its own.
        self.threads = self.cpus

    def describe(self) -> str:
        where = "Ray at " + self.address if self.address else "a local Ray"
        return f"as Ray tasks on {where} ({self.cpus} CPU(s), {self.gpus:g} GPU(s) per cell)"

    def map(self, fn, jobs):
        # max_retries=0: the driver retries a cell the same way whichever executor ran it.
        remote = self.ray.remote(fn).options(num_cpus=self.cpus, num_gpus=self.gpus, max_retries=0)
        refs = {remote.remote(job): job for job in jobs}
        try:
            while refs:
                done, _ = self.ray.wait(list(refs), num_returns=1, timeout=TICK_S)
                if not done:
                    yield None
                for ref in done:
                    job = refs.pop(ref)
                    try:
                        yield job, self.ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - a worker or node was lost
                        yield job, failure(job, e)
        finally:
            for ref in refs:
                self.ray.cancel(ref, force=True)

    def record(self) -> dict:
        return {"address": self.ray.get_runtime_context().gcs_address if self.ray.is_initialized() else None}

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
        if self.reaper is not None:
            self.reaper.stdin.close()  # Ray has shut its processes down: the reaper ends any straggler
            self.reaper.wait()


class SubmititJobs(Executor):
    """A job array through submitit: on Slurm, or as processes here with cluster 'local'."""
    name = "slurm"
    slots = None

    def __init__(self, run_dir: RunDir, o: ExecutorOptions):
        import submitit

        self.submitit, self.cluster = submitit, o.slurm_cluster
        # Inside the run directory: Slurm's nodes must see the pickled jobs and write their logs to a
        # filesystem the driver shares, which the run directory has to be anyway.
        self.run_dir = RunDir(run_dir)
        self.folder = self.run_dir.slurm_folder
        self.executor = submitit.AutoExecutor(folder=self.folder, cluster=o.slurm_cluster)
        self.cpus, self.gpus = o.cpus_per_cell or 1, int(o.gpus_per_cell or 0)
        self.threads = self.cpus
        # Always a time limit and a GPU count: submitit's default limits are a few minutes, and its
        # local executor hides every GPU unless told how many a job gets.
        parameters = {"name": "tmem-bench", "timeout_min": minutes(o.slurm_time), "nodes": 1,
                      "tasks_per_node": 1, "cpus_per_task": self.cpus, "gpus_per_node": self.gpus}
        if o.slurm_cluster == "slurm":
            parameters.update(slurm_additional_parameters=dict(o.slurm_options))
            if o.slurm_partition:
                parameters["slurm_partition"] = o.slurm_partition
            if o.workers:
                parameters["slurm_array_parallelism"] = o.workers
        self.executor.update_parameters(**parameters)
        self.submitted: list[dict] = []
        self.earlier = self._live_earlier_jobs()

    def describe(self) -> str:
        where = "Slurm" if self.cluster == "slurm" else "this machine through submitit"
        return f"as a job array on {where} ({self.cpus} CPU(s), {self.gpus} GPU(s) per cell; logs in {self.folder})"

    def map(self, fn, jobs):
        adopted = {job["cell_id"]: self.earlier[job["cell_id"]] for job in jobs if job["cell_id"] in self.earlier}
        fresh = [job for job in jobs if job["cell_id"] not in adopted]
        try:
            handles = self.executor.map_array(fn, fresh) if fresh else []
        except Exception as e:  # noqa: BLE001 - sbatch refused: a partition, account or option it does not know
            raise UsageError(f"the job array was not submitted: {_first_line(e)}") from None
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


def make_executor(o: ExecutorOptions, run_dir: RunDir, device: str) -> Executor:
    if o.kind == "local":
        import torch

        return LocalPool(o.workers, o.cpus_per_cell, torch.cuda.device_count() if device in ("auto", "cuda") else 0)
    if o.kind == "ray":
        return RayTasks(o.address, o.cpus_per_cell, o.gpus_per_cell)
    if o.kind == "slurm":
        return SubmititJobs(run_dir, o)
    return Executor(o.cpus_per_cell)


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
    if record.get("executor") not in EXECUTORS:
        return f"executor {record.get('executor')!r} is not one of {', '.join(EXECUTORS)}"
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
