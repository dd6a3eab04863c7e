"""Running a planned ladder on a Ray cluster: one Ray task per rung.

    run_ray_ladder(ladder_dir, address=None, cpus_per_rung=1, gpus_per_rung=0,
                   retries=1, worker_retries=3) -> dict

The same rules as the local executor, from the same driver (delphi.ladder.driver):
a completed or diverged rung is skipped, each rung trains under its exclusive
flock on `locks/<run_id>.lock` (`run_rung`), and `train(..., resume=True)`
continues a rung from its last checkpoint. Only the placement differs: each
pending rung is a Ray task declaring `num_cpus` / `num_gpus`, and Ray decides
where and how many run at once.
Seeds are not grouped here: the Ray placer has no `place_group`, so every seed
is its own task (the local executor trains a cell's seeds as one job).

Two kinds of retry:
- worker death (the process is killed, OOM-killed, or its node is lost): Ray
  resubmits the task itself, up to `worker_retries` times (`max_retries`). The
  kernel dropped the dead process's lock, so the new attempt takes it and
  resumes from the last checkpoint;
- a rung that fails (the trainer raised, or stopped early): the driver submits
  it again, up to `retries` times. A diverged rung is a result, not a failure.
A rung whose lock is held by a live process elsewhere (another `delphi ladder
run` on the same ladder) is not run twice: its task returns at once and the
driver resubmits it a few seconds later, until the other process has finished it.

Every task reads its config from, and writes its run dir, lock and log into, the
ladder dir, so on a cluster LADDER_DIR must be one path on a filesystem shared by
every node (NFSv4, Lustre mounted with `flock`, GPFS...) and the delphi package
must be installed on every node. Environment variables named DELPHI_* are
forwarded from the driver to the tasks.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from delphi.errors import DelphiError
from delphi.ladder.driver import PROGRESS_EVERY_S, LadderDriver, Outcome, Rung, rung_status
from delphi.ladder.runner import run_rung_into_log

RAY_INSTALL_HINT = "pip install 'delphi[ray]' (or pip install 'ray>=2.9')"
DEFAULT_WORKER_RETRIES = 3  # Ray's own default max_retries for a task
WAIT_S = 0.5
FORWARDED_ENV_PREFIX = "DELPHI_"
# A rung with one CPU and no GPU: one XLA thread, so rungs sharing a node do not fight over cores.
SINGLE_CORE_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false"
# A fractional GPU: JAX would preallocate 75% of the device; leave room for the other rungs on it.
GPU_MEMORY_HEADROOM = 0.9
CANCEL_WAIT_S = 60.0
CONNECT_TIMEOUT_S = 10.0


def import_ray():
    """Ray, or a DelphiError (exit 2) saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise DelphiError(f"--executor ray: Ray is not installed ({e}); install it with {RAY_INSTALL_HINT}") from None
    return ray


def validate_resources(cpus_per_rung: float, gpus_per_rung: float, retries: int, worker_retries: int) -> None:
    if cpus_per_rung < 0:
        raise DelphiError(f"--cpus-per-rung: must be >= 0, got {cpus_per_rung:g}")
    if gpus_per_rung < 0:
        raise DelphiError(f"--gpus-per-rung: must be >= 0, got {gpus_per_rung:g}")
    if cpus_per_rung == 0 and gpus_per_rung == 0:
        raise DelphiError("--cpus-per-rung: a rung must declare some CPUs or GPUs, got 0 of both")
    if gpus_per_rung > 1 and gpus_per_rung != int(gpus_per_rung):
        raise DelphiError(f"--gpus-per-rung: above 1 it must be a whole number (Ray's rule), got {gpus_per_rung:g}")
    if retries < 0:
        raise DelphiError(f"--retries: must be >= 0, got {retries}")
    if worker_retries < 0:
        raise DelphiError(f"--worker-retries: must be >= 0, got {worker_retries}")


def rung_task(config: str, run_dir: str, lock_path: str, log_path: str, cpus: float, gpus: float) -> dict:
    """Body of one rung's Ray task, on whichever node Ray picked.

    Runs the rung in this worker process (so a killed worker takes the training
    and its lock with it), with stdout/stderr appended to the rung's log in the
    ladder dir. Returns the exit code `run_rung` gives, the status and where it ran.
    """
    host, pid = socket.gethostname(), os.getpid()
    if not Path(config).is_file():
        raise DelphiError(
            f"{config}: not visible on node {host}; the ladder dir must be on a filesystem shared by every node"
        )
    if gpus == 0 and cpus <= 1:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SINGLE_CORE_XLA_FLAGS}".strip()
    if 0 < gpus < 1:
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{GPU_MEMORY_HEADROOM * gpus:.3f}")
    with open(log_path, "a") as log:
        log.write(f"--- ray attempt on {host} pid {pid} at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        log.flush()
        code = run_rung_into_log(config, run_dir, lock_path, log)
    return {"exit": code, "status": rung_status(Path(run_dir)), "host": host, "pid": pid}


def _check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A HOST:PORT (or ray://HOST:PORT) nobody listens on: fail now (Ray itself retries for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and the like: Ray resolves them
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise DelphiError(f"--address: cannot reach the Ray cluster at {address}: {e}") from None


def _forwarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIX)}


def _one_line(error: BaseException) -> str:
    lines = [ln for ln in str(error).splitlines() if ln.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}".strip()


def run_ray_ladder(
    ladder_dir: str | Path,
    *,
    address: str | None = None,
    cpus_per_rung: float = 1.0,
    gpus_per_rung: float = 0.0,
    retries: int = 1,
    worker_retries: int = DEFAULT_WORKER_RETRIES,
    progress: bool = True,
    progress_every_s: float = PROGRESS_EVERY_S,
    budgets: tuple[float, ...] | None = None,
) -> dict:
    """Run every rung of `ladder_dir` that is not completed (or diverged) as Ray tasks; return a summary.

    Connects to the Ray cluster at `address` ("auto", "ray://host:10001", host:port)
    or, when None and Ray is not initialised in this process, starts a local Ray
    instance (shut down again at the end). An already initialised Ray is reused.
    """
    validate_resources(cpus_per_rung, gpus_per_rung, retries, worker_retries)
    ray = import_ray()
    ladder_dir = Path(ladder_dir).resolve()  # the tasks see the same absolute path (shared filesystem)
    driver = LadderDriver(
        ladder_dir, retries=retries, progress=progress, progress_every_s=progress_every_s, budgets=budgets
    )
    extra = {"executor": "ray", "cpus_per_rung": cpus_per_rung, "gpus_per_rung": gpus_per_rung}
    if not driver.waiting:  # nothing to run: no need to start or join a cluster
        return driver.summary(**extra)
    started_ray = not ray.is_initialized()
    if started_ray:
        if address:
            _check_reachable(address)
        try:
            ray.init(address=address)
        except ConnectionError as e:
            raise DelphiError(f"--address: cannot join the Ray cluster at {address or '$RAY_ADDRESS'}: {e}") from None
    try:
        driver.make_dirs()  # only once the cluster answered: a bad --address writes nothing
        driver.drive(RayPlacer(ray, cpus_per_rung, gpus_per_rung, worker_retries), WAIT_S)
        return driver.summary(**extra)
    finally:
        if started_ray:
            ray.shutdown()


class RayPlacer:
    """Each rung a Ray task; Ray queues what does not fit yet, so the driver places every rung at once."""

    def __init__(self, ray, cpus: float, gpus: float, worker_retries: int) -> None:
        self.ray, self.cpus, self.gpus = ray, cpus, gpus
        cluster = ray.cluster_resources()
        if cluster.get("CPU", 0) < cpus or cluster.get("GPU", 0) < gpus:
            # An autoscaling cluster may still add such a node; a fixed one never will and the tasks wait forever.
            print(
                f"[ladder] warning: the Ray cluster has {cluster.get('CPU', 0):g} CPUs and "
                f"{cluster.get('GPU', 0):g} GPUs in all, less than one rung's {cpus:g} CPUs and {gpus:g} GPUs; "
                "the rungs wait until such a node joins",
                file=sys.stderr,
                flush=True,
            )
        self.options = dict(num_cpus=cpus, num_gpus=gpus, max_retries=worker_retries, retry_exceptions=False)
        env = _forwarded_env()
        if env:
            self.options["runtime_env"] = {"env_vars": env}
        # max_calls=1: a fresh worker process per rung, so JAX and accelerator memory go back when it ends.
        self.task = ray.remote(max_calls=1)(rung_task)
        self.in_flight: dict[object, Rung] = {}

    def free_slots(self) -> int:
        return sys.maxsize

    def place(self, rung: Rung, lock_path: Path, log_path: Path) -> None:
        ref = self.task.options(**self.options, name=f"delphi-rung-{rung.run_id}").remote(
            str(rung.config),
            str(rung.run_dir),
            str(lock_path),
            str(log_path),
            self.cpus,
            self.gpus,
        )
        self.in_flight[ref] = rung

    def wait(self, timeout_s: float) -> list[Outcome]:
        if not self.in_flight:
            time.sleep(timeout_s)
            return []
        ready, _ = self.ray.wait(list(self.in_flight), num_returns=len(self.in_flight), timeout=timeout_s)
        outcomes = []
        for ref in ready:
            rung = self.in_flight.pop(ref)
            try:
                result = self.ray.get(ref)
                outcomes.append(Outcome(rung, result["exit"], f"exit {result['exit']} on {result['host']}"))
            except self.ray.exceptions.RayError as e:  # the trainer raised, or the worker died too often
                outcomes.append(Outcome(rung, None, _one_line(e)))
        return outcomes

    def in_flight_note(self, rungs: list[Rung]) -> tuple[int, str]:
        training = sum(1 for r in rungs if rung_status(r.run_dir) == "running")
        return training, f", {len(rungs) - training} queued/starting on Ray"

    def stop(self) -> None:
        """Interrupt the rungs (KeyboardInterrupt in each task) and wait for them."""
        for ref in self.in_flight:
            self.ray.cancel(ref)
        if self.in_flight:
            self.ray.wait(list(self.in_flight), num_returns=len(self.in_flight), timeout=CANCEL_WAIT_S)


# ---- CLI glue (`delphi ladder run --executor ray`) ------------------------------------------------

RAY_ONLY_OPTIONS = ("address", "cpus_per_rung", "gpus_per_rung", "worker_retries")


def reject_ray_options(args) -> None:
    """`--executor local` with a Ray-only option is a mistake, not something to ignore."""
    given = [f"--{name.replace('_', '-')}" for name in RAY_ONLY_OPTIONS if getattr(args, name, None) is not None]
    if given:
        raise DelphiError(f"{given[0]}: only applies to --executor ray")


def run_ray_ladder_from_args(args) -> dict:
    if args.workers is not None:
        raise DelphiError(
            "--workers: only applies to --executor local; with ray, --cpus-per-rung/--gpus-per-rung "
            "and the cluster's size set how many rungs run at once"
        )
    return run_ray_ladder(
        args.ladder_dir,
        address=args.address,
        cpus_per_rung=1.0 if args.cpus_per_rung is None else args.cpus_per_rung,
        gpus_per_rung=0.0 if args.gpus_per_rung is None else args.gpus_per_rung,
        retries=args.retries,
        worker_retries=DEFAULT_WORKER_RETRIES if args.worker_retries is None else args.worker_retries,
        budgets=None if args.budgets is None else tuple(args.budgets),
    )
