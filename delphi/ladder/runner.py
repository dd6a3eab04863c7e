"""Running a planned ladder: local worker processes, one rung at a time each.

    run_ladder(ladder_dir, workers=None, retries=1) -> dict

The rules (which rungs run, in which order, retries, progress, summary) are the
driver's (delphi.ladder.driver); this module only places rungs on local worker
processes. By default there is one worker per core, each pinned to its core with
a one-thread XLA runtime, so workers x threads = cores (no oversubscription);
with fewer pending rungs than cores, fewer workers with several cores each.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from delphi.errors import DelphiError
from delphi.ladder.driver import (  # noqa: F401  (re-exported: the names every caller of the runner knows)
    EXIT_COMPLETED,
    EXIT_DIVERGED,
    EXIT_FAILED,
    EXIT_LOCKED,
    LOCKED_RETRY_S,
    LOCKS_DIR,
    LOGS_DIR,
    PROGRESS_EVERY_S,
    LadderDriver,
    Outcome,
    Rung,
    is_finished,
    load_rungs,
    progress_line,
    rung_status,
)

POLL_S = 0.5
STOP_WAIT_S = 60.0  # a stopped rung writes its checkpoint first
# One core per worker: no intra-op thread pool to fight over it (JAX FAQ's single-thread XLA CPU flags).
SINGLE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
# A ladder worker's resident memory: JAX + XLA runtime ~0.4 GB, a ladder rung's state and activations
# tens of MB; with room for the compiler's peaks.
WORKER_MEMORY_BYTES = 1024**3
WORKER_LOG_PREFIX = "worker-slot"  # logs/worker-slot<N>.log: a persistent worker's output outside its rungs
JAX_CACHE_ENV = "DELPHI_JAX_CACHE"
JAX_CACHE_SUBDIR = "jax"
# Cache every program that takes this long to compile: a train chunk takes seconds, the eval step
# ~0.3-1 s; the many tiny eager ops of model init (milliseconds each) are not worth a file each.
JAX_CACHE_MIN_COMPILE_S = 0.25
JAX_CACHE_MAX_BYTES = 2 * 1024**3  # LRU-evicted beyond this (ladder programs are ~0.1-2 MB each)


# ---- what runs inside a worker --------------------------------------------------------------------


def jax_cache_dir() -> Path | None:
    """The per-machine JAX compilation cache directory, or None when switched off."""
    configured = os.environ.get(JAX_CACHE_ENV, "")
    if configured.lower() in ("off", "0", "none", "false"):
        return None
    if configured:
        return Path(configured).expanduser()
    from delphi.data.store import cache_dir

    return cache_dir() / JAX_CACHE_SUBDIR


def enable_compilation_cache() -> Path | None:
    """Point this process's JAX at the persistent compilation cache (before anything compiles)."""
    path = jax_cache_dir()
    if path is None:
        return None
    import jax

    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", JAX_CACHE_MIN_COMPILE_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", JAX_CACHE_MAX_BYTES)
    return path


def run_rung(config: str | Path, run_dir: str | Path, lock_path: str | Path) -> int:
    """One rung in this process under its lock; the exit code tells the executor what happened.

    The lock lives as long as this call (or this process, if it dies): the kernel
    drops a dead process's flock, so a killed rung can be retried at once.
    """
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{run_dir}: locked by another process", file=sys.stderr)
            return EXIT_LOCKED
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        enable_compilation_cache()
        from delphi.train.config import load_train_config
        from delphi.train.trainer import train

        cfg = load_train_config(config)
        summary = train(cfg, Path(run_dir), resume=True, progress=False)
    status = summary.get("status")
    print(json.dumps({k: summary.get(k) for k in ("status", "steps", "val_loss", "wall_time_s")}), file=sys.stderr)
    if status == "completed":
        return EXIT_COMPLETED
    if status == "diverged":
        return EXIT_DIVERGED
    return EXIT_FAILED


def run_rung_into_log(config: str | Path, run_dir: str | Path, lock_path: str | Path, log: IO[str]) -> int:
    """`run_rung` with this process's stdout and stderr (file descriptors 1 and 2) appended to `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
        return run_rung(config, run_dir, lock_path)
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _pin(cores: str) -> None:
    if cores:
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})


def _worker(config: str, run_dir: str, lock_path: str, cores: str) -> int:
    """One rung in this worker process, pinned to `cores` (comma-separated; empty: no pinning)."""
    _pin(cores)
    return run_rung(config, run_dir, lock_path)


def serve(cores: str) -> int:
    """A persistent worker: one JSON job per stdin line, one JSON result per line on stdout.

    A job is {"config", "run_dir", "lock", "log"}; the result is {"exit": code}. The
    worker stops at the end of its input, and after a rung that raised (a fresh
    process for the next rung, in case the error left JAX in a bad state).
    """
    _pin(cores)
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed outside a rung goes to the worker's log, never into the results
    for line in sys.stdin:
        job = json.loads(line)
        with open(job["log"], "a") as log:
            try:
                code = run_rung_into_log(job["config"], job["run_dir"], job["lock"], log)
            except Exception:  # printed into the rung's log by run_rung_into_log
                results.write(json.dumps({"exit": EXIT_FAILED, "raised": True}) + "\n")
                return EXIT_FAILED
        results.write(json.dumps({"exit": code}) + "\n")
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


def worker_env(cores: list[int], pin_cores: bool) -> dict[str, str]:
    env = dict(os.environ)
    if pin_cores and len(cores) == 1:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {SINGLE_THREAD_XLA_FLAGS}".strip()
    return env


@dataclass
class _Job:
    rung: Rung
    proc: subprocess.Popen
    log: IO[str] | None = field(default=None, repr=False)  # one-shot workers: the process's own output


@dataclass
class _Slot:
    cores: list[int]
    proc: subprocess.Popen | None = None  # persistent worker, when started
    job: _Job | None = None
    buffer: bytes = b""


class LocalPlacer:
    """Rungs on local worker processes, one slot of cores per worker.

    persistent=True: one long-lived worker per slot trains rung after rung
    (`serve`); False: a fresh process per rung (`_worker`), as before.
    pin_cores=False: no affinity and no thread limits (every worker sees every core).
    """

    def __init__(
        self, slots: list[list[int]], log_dir: Path, *, persistent: bool = True, pin_cores: bool = True
    ) -> None:
        self.slots = [_Slot(cores) for cores in slots]
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
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=worker_env(slot.cores, self.pin_cores),
            )
        os.set_blocking(proc.stdout.fileno(), False)
        self.selector.register(proc.stdout, selectors.EVENT_READ, slot)
        slot.buffer = b""
        return proc

    def place(self, rung: Rung, lock_path: Path, log_path: Path) -> None:
        slot = next(s for s in self.slots if s.job is None)
        with open(log_path, "a") as log:
            log.write(f"--- attempt {rung.attempts} on cores {slot.cores} at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        if not self.persistent:
            log = open(log_path, "a")
            proc = subprocess.Popen(
                [sys.executable, "-m", "delphi.ladder.runner", str(rung.config), str(rung.run_dir), str(lock_path),
                 self._cores_arg(slot)],
                stdout=log, stderr=subprocess.STDOUT, env=worker_env(slot.cores, self.pin_cores),
            )
            slot.job = _Job(rung, proc, log)
            return
        if slot.proc is None or slot.proc.poll() is not None:
            slot.proc = self._start_worker(slot)
        job = {"config": str(rung.config), "run_dir": str(rung.run_dir), "lock": str(lock_path), "log": str(log_path)}
        slot.job = _Job(rung, slot.proc)
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
                    outcomes.append(Outcome(job.rung, code, f"exit {code}"))
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
                        outcomes.append(Outcome(slot.job.rung, result["exit"], f"exit {result['exit']}"))
                        slot.job = None
                    if result.get("raised"):  # the worker is ending: never send it another rung
                        self._retire(slot)
                        break
                continue
            # End of file: the worker is gone (it raised, was killed, or ran out of memory).
            code = slot.proc.wait()
            self._retire(slot)
            if slot.job is not None:
                why = f"worker killed by {signal.Signals(-code).name}" if code < 0 else f"worker exit {code}"
                outcomes.append(Outcome(slot.job.rung, None if code <= 0 else EXIT_FAILED, why))
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
) -> dict:
    """Run every rung of `ladder_dir` that is not completed (or diverged); return a summary.

    `persistent_workers` and `pin_cores` exist to measure what they gain (benchmarks/ladder.py).
    """
    if workers is not None and workers < 1:
        raise DelphiError(f"--workers: must be >= 1, got {workers}")
    driver = LadderDriver(Path(ladder_dir), retries=retries, progress=progress, progress_every_s=progress_every_s)
    cpus = sorted(os.sched_getaffinity(0))
    workers = workers if workers is not None else default_workers(len(driver.waiting), len(cpus), available_memory_bytes())
    slots = core_slots(workers, cpus)
    driver.make_dirs()
    placer = LocalPlacer(slots, driver.ladder_dir / LOGS_DIR, persistent=persistent_workers, pin_cores=pin_cores)
    try:
        driver.drive(placer, POLL_S)
    finally:
        placer.close()
    return driver.summary(
        executor="local", workers=workers, cores_per_worker=[len(s) for s in slots],
        persistent_workers=persistent_workers, pinned=pin_cores,
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        sys.exit(serve(sys.argv[2] if len(sys.argv) > 2 else ""))
    sys.exit(_worker(*sys.argv[1:5]))
