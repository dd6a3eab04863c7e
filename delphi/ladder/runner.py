"""Running a planned ladder: local worker processes, one rung at a time each.

    run_ladder(ladder_dir, workers=None, retries=1) -> dict

The rules (which rungs run, in which order, retries, progress, summary) are the
driver's (delphi.ladder.driver); this module only places rungs on local worker
processes. By default there is one worker per core, each pinned to its core with
a one-thread XLA runtime, so workers x threads = cores (no oversubscription);
with fewer pending rungs than cores, fewer workers with several cores each, still
one thread each: a rung's numbers do not depend on how many workers ran beside it
(XLA's CPU sums round differently over another thread count; docs/design.md §4.6).
On a machine with GPUs (DELPHI_DEVICE=gpu, set by `--device gpu`; or auto where JAX's CUDA
build is installed) there is one worker per GPU instead, each seeing only its own
(CUDA_VISIBLE_DEVICES; delphi.train.device.worker_gpus).

A worker is a persistent process (`python -m delphi.ladder.runner --serve CORES`)
that trains the rungs it is sent one after another, so the interpreter start,
the imports and the trainer's matmul-peak measurement are paid once per worker,
not once per rung. Each rung calls `run_rung`, which holds an exclusive `flock` on
`locks/<run_id>.lock` for the whole rung and calls
`delphi.train.trainer.train(cfg, run_dir, resume=True, progress=False)`. Because
the trainer resumes from its last checkpoint and the data order is a pure
function of the step, a killed ladder restarted with the same command finishes
only what is missing. The kernel drops a dead process's lock (even after
SIGKILL), so there are no stale locks; a second `delphi ladder run` on the same
ladder skips a locked rung and comes back to it later. A worker that dies is
replaced; its rung counts as failed (and is retried `retries` times).

Seeds of one cell (see delphi.ladder.driver) go to one worker as one job,
`run_group`: it takes every member's lock (a member locked elsewhere is
reported EXIT_LOCKED and left alone), skips the finished members, trains the
others as one vmapped program (`train_group(..., resume=True)`: a killed group
resumes from the newest step all its members hold) and returns one exit code per
member; a member that diverges stops counting while the others train on. The
group's output goes to the first member's log; each other member's log says so
and gets its own result line.

Ladder workers use JAX's persistent compilation cache in a per-machine directory
($DELPHI_CACHE/jax, default ~/.cache/delphi/jax; DELPHI_JAX_CACHE=DIR overrides
it, DELPHI_JAX_CACHE=off disables it), so a program of one shape compiles once
per machine: reruns, retries, resumed rungs and seeds of one shape reuse it.
"""

from __future__ import annotations

import fcntl
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import traceback
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import jax

from delphi.errors import DelphiError
from delphi.ladder.driver import (
    EXIT_COMPLETED,
    EXIT_DIVERGED,
    EXIT_FAILED,
    EXIT_LOCKED,
    LOGS_DIR,
    PROGRESS_EVERY_S,
    LadderDriver,
    Outcome,
    Rung,
    is_finished,
    rung_status,
)
from delphi.train.checkpoint import check_checkpoint_path
from delphi.train.config import load_train_config
from delphi.train.device import CUDA_VISIBLE_ENV, check_gpu_host, worker_gpus
from delphi.train.environment import (
    check_cache_dirs,
    device_env,
    jax_cache_dir,
    single_thread_xla_flags,
)
from delphi.train.rundir import record_death, signal_death_reason
from delphi.train.trainer import train_group

POLL_S = 0.5
STOP_WAIT_S = 60.0  # a stopped rung writes its checkpoint first
# A ladder worker's resident memory: JAX + XLA runtime ~0.4 GB, a ladder rung's state and activations
# tens of MB; with room for the compiler's peaks.
WORKER_MEMORY_BYTES = 1024**3
WORKER_LOG_PREFIX = "worker-slot"  # logs/worker-slot<N>.log: a persistent worker's output outside its rungs
# Cache every program that takes this long to compile: a train chunk takes seconds, the eval step
# ~0.3-1 s; the many tiny eager ops of model init (milliseconds each) are not worth a file each.
JAX_CACHE_MIN_COMPILE_S = 0.25
JAX_CACHE_MAX_BYTES = 2 * 1024**3  # LRU-evicted beyond this (ladder programs are ~0.1-2 MB each)


# ---- what runs inside a worker --------------------------------------------------------------------


def enable_compilation_cache() -> Path | None:
    """Point this process's JAX at the persistent compilation cache (before anything compiles)."""
    path = jax_cache_dir()
    if path is None:
        return None
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", JAX_CACHE_MIN_COMPILE_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", JAX_CACHE_MAX_BYTES)
    return path


def _exit_code(status: str | None) -> int:
    if status == "completed":
        return EXIT_COMPLETED
    if status == "diverged":
        return EXIT_DIVERGED
    return EXIT_FAILED


def _take_lock(stack: ExitStack, lock_path: str | Path) -> bool:
    """Hold `lock_path`'s flock until `stack` closes (or this process dies); False if another holds it."""
    lock = stack.enter_context(open(lock_path, "a+"))
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return True


def run_group(configs: list[str | Path], run_dirs: list[str | Path], lock_paths: list[str | Path]) -> list[int]:
    """Rungs of one cell (configs equal but for their seeds) trained in this process as one seed
    group under their locks; one exit code per rung. A single rung is a group of one.

    A rung locked by another process gets EXIT_LOCKED and is left alone (the others train without
    it); a finished rung (completed or diverged) is not trained again. The locks live as long as
    this call (or this process, if it dies): the kernel drops a dead process's flock, so a killed
    group can be retried at once.
    """
    codes: list[int | None] = [None] * len(configs)
    with ExitStack() as locks:
        for i, (run_dir, lock_path) in enumerate(zip(run_dirs, lock_paths)):
            if not _take_lock(locks, lock_path):
                print(f"{run_dir}: locked by another process", file=sys.stderr)
                codes[i] = EXIT_LOCKED
            elif is_finished(status := rung_status(Path(run_dir))):
                codes[i] = _exit_code(status)
        todo = [i for i, code in enumerate(codes) if code is None]
        if todo:
            enable_compilation_cache()

            cfgs = [load_train_config(configs[i]) for i in todo]
            summaries = train_group(cfgs, [Path(run_dirs[i]) for i in todo], resume=True, progress=False)
            for i, summary in zip(todo, summaries):
                codes[i] = _exit_code(summary.get("status"))
                result = {k: summary.get(k) for k in ("status", "steps", "val_loss", "wall_time_s")}
                print(
                    json.dumps({"run_dir": str(run_dirs[i]), **result} if len(configs) > 1 else result), file=sys.stderr
                )
    return [int(code) for code in codes]


def run_rung(config: str | Path, run_dir: str | Path, lock_path: str | Path) -> int:
    """One rung in this process under its lock; the exit code tells the executor what happened."""
    return run_group([config], [run_dir], [lock_path])[0]


def run_group_into_log(
    configs: list[str | Path], run_dirs: list[str | Path], lock_paths: list[str | Path], logs: list[IO[str]]
) -> list[int]:
    """`run_group` with this process's stdout and stderr (file descriptors 1 and 2) appended to the
    first member's log; every other member's log says where the output went and gets its result."""
    for log in logs[1:]:
        log.write(
            f"trained in a seed group with {Path(run_dirs[0]).name}: its output is in {Path(logs[0].name).name}\n"
        )
        log.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(logs[0].fileno(), 1)
    os.dup2(logs[0].fileno(), 2)
    try:
        codes = run_group(configs, run_dirs, lock_paths)
    except BaseException:
        traceback.print_exc()
        for log in logs[1:]:
            log.write("the seed group raised (traceback in the first member's log)\n")
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
    for run_dir, log, code in list(zip(run_dirs, logs, codes))[1:]:
        log.write(json.dumps({"status": rung_status(Path(run_dir)), "exit": code}) + "\n")
    return codes


def run_rung_into_log(config: str | Path, run_dir: str | Path, lock_path: str | Path, log: IO[str]) -> int:
    """`run_rung` with this process's stdout and stderr (file descriptors 1 and 2) appended to `log`."""
    return run_group_into_log([config], [run_dir], [lock_path], [log])[0]


def _pin(cores: str) -> None:
    if cores:
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})


def _worker(config: str, run_dir: str, lock_path: str, cores: str) -> int:
    """One rung in this worker process, pinned to `cores` (comma-separated; empty: no pinning)."""
    _pin(cores)
    return run_rung(config, run_dir, lock_path)


def serve(cores: str) -> int:
    """A persistent worker: one JSON job per stdin line, one JSON result per line on stdout.

    A job is {"configs", "run_dirs", "locks", "logs"} (one entry per member of a seed group); the
    result is {"exits": [code per member]}. The worker stops at the end of its input, and after a
    job that raised (a fresh process for the next job, in case the error left JAX in a bad state).
    """
    _pin(cores)
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed outside a rung goes to the worker's log, never into the results
    for line in sys.stdin:
        job = json.loads(line)
        with ExitStack() as stack:
            logs = [stack.enter_context(open(path, "a")) for path in job["logs"]]
            try:
                codes = run_group_into_log(job["configs"], job["run_dirs"], job["locks"], logs)
            except Exception:  # printed into the first member's log by run_group_into_log
                results.write(json.dumps({"exits": [EXIT_FAILED] * len(logs), "raised": True}) + "\n")
                return EXIT_FAILED
        results.write(json.dumps({"exits": codes}) + "\n")
    return 0


# ---- placement: slots of cores, one worker process per slot -------------------------------------


def core_slots(workers: int, cpus: list[int] | None = None) -> list[list[int]]:
    """Split the CPUs this process may use into `workers` disjoint groups, as even as possible.

    More workers than CPUs: each worker gets one CPU, shared round-robin.
    """
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    n = len(cpus)
    if workers >= n:
        return [[cpus[i % n]] for i in range(workers)]
    return [cpus[i * n // workers : (i + 1) * n // workers] for i in range(workers)]


def available_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def default_workers(pending_rungs: int, cpus: int, memory_bytes: int | None = None) -> int:
    """One worker per core, but never more workers than rungs to run (with fewer rungs than cores,
    each worker gets several cores: a lone rung gets the whole machine), nor than the free memory
    holds at WORKER_MEMORY_BYTES each."""
    workers = min(cpus, pending_rungs)
    if memory_bytes is not None:
        workers = min(workers, memory_bytes // WORKER_MEMORY_BYTES)
    return max(1, workers)


def worker_env(pin_cores: bool, gpu: str | None = None) -> dict[str, str]:
    """A worker's environment: with pinning, a one-thread XLA runtime whatever its slot's cores, so
    that a rung's numbers do not depend on how many workers ran beside it (XLA's CPU sums round
    differently over another thread count). `gpu`: the one GPU the worker sees (CUDA_VISIBLE_DEVICES), so that each rung has a GPU to itself."""
    env = dict(os.environ)
    if pin_cores:  # one core per worker: no intra-op thread pool to fight over it
        env["XLA_FLAGS"] = single_thread_xla_flags(env.get("XLA_FLAGS"))
    if gpu is not None:
        env[CUDA_VISIBLE_ENV] = gpu
    return env


@dataclass
class _Job:
    rungs: list[Rung]  # one, or the members of a seed group
    proc: subprocess.Popen
    log: IO[str] | None = field(default=None, repr=False)  # one-shot workers: the process's own output


@dataclass
class _Slot:
    cores: list[int]
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES of its worker (None: what the environment says)
    proc: subprocess.Popen | None = None  # persistent worker, when started
    job: _Job | None = None
    buffer: bytes = b""


def _record_worker_death(rungs: list[Rung], code: int) -> str | None:
    """A worker killed by a signal (an abort inside XLA, the OOM killer) wrote nothing about it:
    record it in each of its rungs' status.json (failed, with the reason) and remove their stale
    train.lock (delphi.train.rundir.record_death); the reason, or None for an ordinary exit."""
    if code >= 0:
        return None

    reason = "worker " + signal_death_reason(-code).removeprefix("the trainer process ")
    for rung in rungs:
        if rung.run_dir.is_dir():
            record_death(rung.run_dir, reason)
    return reason


class LocalPlacer:
    """Rungs on local worker processes, one slot of cores per worker.

    persistent=True: one long-lived worker per slot trains rung after rung
    (`serve`); False: a fresh process per rung (`_worker`), as before.
    pin_cores=False: no affinity and no thread limits (every worker sees every core).
    """

    def __init__(
        self,
        slots: list[list[int]],
        log_dir: Path,
        *,
        persistent: bool = True,
        pin_cores: bool = True,
        gpus: list[str] | None = None,
    ) -> None:
        self.slots = [_Slot(cores, gpus[i % len(gpus)] if gpus else None) for i, cores in enumerate(slots)]
        self.log_dir = log_dir
        self._closed = False
        self.persistent = persistent
        self.pin_cores = pin_cores
        self.selector = selectors.DefaultSelector()

    def _cores_arg(self, slot: _Slot) -> str:
        return ",".join(map(str, slot.cores)) if self.pin_cores else ""

    def free_slots(self) -> int:
        return sum(1 for s in self.slots if s.job is None)

    def _start_worker(self, slot: _Slot) -> subprocess.Popen:
        index = self.slots.index(slot)
        with open(self.log_dir / f"{WORKER_LOG_PREFIX}{index}.log", "a") as log:  # output outside any rung
            log.write(f"--- worker on cores {slot.cores} at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
            log.flush()
            proc = subprocess.Popen(
                [sys.executable, "-m", "delphi.ladder.runner", "--serve", self._cores_arg(slot)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=worker_env(self.pin_cores, slot.gpu),
            )
        os.set_blocking(proc.stdout.fileno(), False)
        self.selector.register(proc.stdout, selectors.EVENT_READ, slot)
        slot.buffer = b""
        return proc

    def place(self, rung: Rung, lock_path: Path, log_path: Path) -> None:
        self._place([rung], [lock_path], [log_path])

    def place_group(self, rungs: list[Rung], lock_paths: list[Path], log_paths: list[Path]) -> None:
        """The rungs of one cell as one job (`run_group`) on one worker."""
        self._place(rungs, lock_paths, log_paths)

    def _place(self, rungs: list[Rung], lock_paths: list[Path], log_paths: list[Path]) -> None:
        slot = next(s for s in self.slots if s.job is None)
        for rung, log_path in zip(rungs, log_paths):
            with open(log_path, "a") as log:
                group = f" in a seed group of {len(rungs)}" if len(rungs) > 1 else ""
                log.write(
                    f"--- attempt {rung.attempts}{group} on cores {slot.cores} at "
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n"
                )
        if not self.persistent:
            if len(rungs) != 1:
                raise DelphiError("one-shot ladder workers train one rung per process, not seed groups")
            rung, lock_path, log_path = rungs[0], lock_paths[0], log_paths[0]
            log = open(log_path, "a")
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "delphi.ladder.runner",
                    str(rung.config),
                    str(rung.run_dir),
                    str(lock_path),
                    self._cores_arg(slot),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=worker_env(self.pin_cores, slot.gpu),
            )
            slot.job = _Job([rung], proc, log)
            return
        if slot.proc is None or slot.proc.poll() is not None:
            slot.proc = self._start_worker(slot)
        job = {
            "configs": [str(r.config) for r in rungs],
            "run_dirs": [str(r.run_dir) for r in rungs],
            "locks": [str(p) for p in lock_paths],
            "logs": [str(p) for p in log_paths],
        }
        slot.job = _Job(rungs, slot.proc)
        try:
            slot.proc.stdin.write((json.dumps(job) + "\n").encode())
            slot.proc.stdin.flush()
        except BrokenPipeError:  # died since the poll above: wait() reports it as a dead worker
            pass

    def _retire(self, slot: _Slot) -> None:
        """Forget a persistent worker that ended (it is replaced at the next placement)."""
        if slot.proc is not None:
            self.selector.unregister(slot.proc.stdout)
            slot.proc.stdout.close()
            self._close_input(slot)
            slot.proc.wait()
            slot.proc = None

    def wait(self, timeout_s: float) -> list[Outcome]:
        outcomes: list[Outcome] = []
        if not self.persistent:
            time.sleep(timeout_s)
            for slot in self.slots:
                job = slot.job
                if job is not None and (code := job.proc.poll()) is not None:
                    job.log.close()
                    slot.job = None
                    why = _record_worker_death(job.rungs, code) or f"exit {code}"
                    outcomes.append(Outcome(job.rungs[0], code, why))
            return outcomes
        if not self.selector.get_map():
            time.sleep(timeout_s)
            return outcomes
        for key, _ in self.selector.select(timeout_s):
            slot: _Slot = key.data
            chunk = slot.proc.stdout.read()
            if chunk:
                slot.buffer += chunk
                while b"\n" in slot.buffer:
                    line, slot.buffer = slot.buffer.split(b"\n", 1)
                    result = json.loads(line)
                    if slot.job is not None:
                        for rung, code in zip(slot.job.rungs, result["exits"]):
                            outcomes.append(Outcome(rung, code, f"exit {code}"))
                        slot.job = None
                    if result.get("raised"):  # the worker is ending: never send it another rung
                        self._retire(slot)
                        break
                continue
            # End of file: the worker is gone (it raised, was killed, or ran out of memory).
            code = slot.proc.wait()
            self._retire(slot)
            if slot.job is not None:
                why = _record_worker_death(slot.job.rungs, code) or f"worker exit {code}"
                outcomes.extend(Outcome(rung, None if code <= 0 else EXIT_FAILED, why) for rung in slot.job.rungs)
                slot.job = None
        return outcomes

    def in_flight_note(self, rungs: list[Rung]) -> tuple[int, str]:
        return len(rungs), ""

    def stop(self) -> None:
        """Interrupt every rung (the trainer checkpoints on SIGTERM) and wait for the workers."""
        procs = [s.job.proc for s in self.slots if s.job is not None] + [
            s.proc for s in self.slots if s.proc is not None and s.job is None
        ]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for slot in self.slots:  # a persistent worker then reads the end of its input and exits
            self._close_input(slot)
        for proc in procs:
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.close()

    @staticmethod
    def _close_input(slot: _Slot) -> None:
        if slot.proc is not None and slot.proc.stdin and not slot.proc.stdin.closed:
            try:
                slot.proc.stdin.close()
            except BrokenPipeError:
                pass

    def close(self) -> None:
        """End every idle worker (end of input) and release its pipes."""
        if self._closed:
            return
        self._closed = True
        for slot in self.slots:
            if slot.job is not None and slot.job.log is not None:
                slot.job.log.close()
            if slot.proc is not None:
                self._close_input(slot)
                try:
                    slot.proc.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    slot.proc.kill()
                self._retire(slot)
        self.selector.close()


def run_ladder(
    ladder_dir: str | Path,
    *,
    workers: int | None = None,
    retries: int = 1,
    progress: bool = True,
    progress_every_s: float = PROGRESS_EVERY_S,
    persistent_workers: bool = True,
    pin_cores: bool = True,
    group_seeds: bool = False,
    budgets: tuple[float, ...] | None = None,
) -> dict:
    """Run every rung of `ladder_dir` that is not completed (or diverged); return a summary.

    `group_seeds`: the seeds of one cell train together as one job (one vmapped program); False
    trains every rung alone. `budgets`: only those budgets' rungs (a stage of a long ladder). One-shot workers (`persistent_workers=False`) train rungs alone.
    `persistent_workers` and `pin_cores` exist to measure what they gain (benchmarks/ladder.py).
    """
    if workers is not None and workers < 1:
        raise DelphiError(f"--workers: must be >= 1, got {workers}")

    check_cache_dirs()  # before any rung: a cache or a run dir no worker can use would fail every rung in turn
    check_checkpoint_path(Path(ladder_dir))
    group_seeds = group_seeds and persistent_workers
    driver = LadderDriver(
        Path(ladder_dir),
        retries=retries,
        progress=progress,
        progress_every_s=progress_every_s,
        group_seeds=group_seeds,
        budgets=budgets,
    )
    cpus = sorted(os.sched_getaffinity(0))
    device = device_env() or "auto"
    gpus = worker_gpus(device)  # on a GPU machine: one worker per GPU, each on its own
    check_gpu_host(device, gpus)
    if workers is None:
        workers = (
            max(1, min(len(gpus), driver.pending_jobs()))
            if gpus
            else default_workers(driver.pending_jobs(), len(cpus), available_memory_bytes())
        )
    slots = core_slots(workers, cpus)
    driver.make_dirs()
    placer = LocalPlacer(
        slots, driver.ladder_dir / LOGS_DIR, persistent=persistent_workers, pin_cores=pin_cores, gpus=gpus
    )
    try:
        driver.drive(placer, POLL_S)
    finally:
        placer.close()
    return driver.summary(
        executor="local",
        workers=workers,
        cores_per_worker=[len(s) for s in slots],
        persistent_workers=persistent_workers,
        pinned=pin_cores,
        group_seeds=group_seeds,
        gpus=gpus,
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        sys.exit(serve(sys.argv[2] if len(sys.argv) > 2 else ""))
    sys.exit(_worker(*sys.argv[1:5]))
