"""Running a planned ladder: local worker processes, one rung each.

    run_ladder(ladder_dir, workers=None, retries=1) -> dict

Each rung runs in its own process (`python -m delphi.ladder.runner CONFIG RUN_DIR
LOCK CORES`), pinned to its share of the cores, calling
`delphi.train.trainer.train(cfg, run_dir, resume=True, progress=False)`. Because
the trainer resumes from its last checkpoint and the data order is a pure
function of the step, a killed ladder restarted with the same command finishes
only what is missing.

A rung is never run twice at once: its worker holds an exclusive `flock` on
`locks/<run_id>.lock` for the whole run. The kernel drops the lock when the
process dies (even by SIGKILL), so there are no stale locks to clean up; a
second `delphi ladder run` on the same ladder skips a locked rung and comes back
to it later. A rung whose worker fails is retried `retries` times; a diverged
rung is a result, not a failure, and is not retried.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from delphi.errors import DelphiError
from delphi.ladder.plan import RUNS_DIR, read_manifest

LOCKS_DIR = "locks"
LOGS_DIR = "logs"
EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_DIVERGED = 3
EXIT_LOCKED = 75  # EX_TEMPFAIL: another process holds the rung
POLL_S = 0.5
PROGRESS_EVERY_S = 30.0
LOCKED_RETRY_S = 5.0


def rung_status(run_dir: Path) -> str:
    try:
        return json.loads((run_dir / "status.json").read_text()).get("status", "pending")
    except (OSError, ValueError):
        return "pending"


def _last_flops(run_dir: Path) -> float:
    """FLOPs done so far by a running rung: the last complete line of its metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            lines = f.read().splitlines()
    except OSError:
        return 0.0
    for line in reversed(lines):
        try:
            return float(json.loads(line).get("flops") or 0.0)
        except ValueError:
            continue
    return 0.0


def core_slots(workers: int) -> list[list[int]]:
    """Split the CPUs this process may use into `workers` disjoint groups."""
    cpus = sorted(os.sched_getaffinity(0))
    per = max(1, len(cpus) // workers)
    return [cpus[(i * per) % len(cpus) : (i * per) % len(cpus) + per] for i in range(workers)]


@dataclass
class _Rung:
    run_id: str
    config: Path
    run_dir: Path
    flops: float
    attempts: int = 0
    not_before: float = 0.0


@dataclass
class _Running:
    rung: _Rung
    proc: subprocess.Popen
    slot: int
    started: float
    log: object = field(repr=False, default=None)


def load_rungs(ladder_dir: Path, rows: list[dict[str, str]] | None = None) -> list[_Rung]:
    """The manifest's rungs, each with its config (which must exist) and run dir."""
    rows = read_manifest(ladder_dir) if rows is None else rows
    rungs = []
    for row in rows:
        config = ladder_dir / row["config"]
        if not config.is_file():
            raise DelphiError(f"{ladder_dir}/manifest.csv: rung {row['run_id']}: config {config} is missing")
        rungs.append(_Rung(row["run_id"], config, ladder_dir / RUNS_DIR / row["run_id"], float(row["flops"])))
    return rungs


def is_finished(status: str) -> bool:
    """Skip rule shared by every executor: a completed or diverged rung is a result and never rerun."""
    return status in ("completed", "diverged")


def _format_s(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def progress_line(
    rungs_done: int, rungs: int, running: int, failed: int, flops_done: float, flops_total: float,
    flops_per_s: float, elapsed_s: float, flops_left: float,
) -> str:
    """`[ladder] 3/20 rungs done (2 running, 0 failed), FLOPs done/total, rate, elapsed, ETA`."""
    eta = _format_s(flops_left / flops_per_s) if flops_per_s > 0 else "?"
    return (
        f"[ladder] {rungs_done}/{rungs} rungs done ({running} running, {failed} failed), "
        f"{flops_done:.3g}/{flops_total:.3g} FLOPs ({flops_done / max(flops_total, 1e-30):.0%}), "
        f"{flops_per_s / 1e9:.1f} GFLOP/s, elapsed {_format_s(elapsed_s)}, ETA {eta}"
    )


def run_ladder(
    ladder_dir: str | Path,
    *,
    workers: int | None = None,
    retries: int = 1,
    progress: bool = True,
    progress_every_s: float = PROGRESS_EVERY_S,
) -> dict:
    """Run every rung of `ladder_dir` that is not completed (or diverged); return a summary."""
    ladder_dir = Path(ladder_dir)
    rows = read_manifest(ladder_dir)
    ncpu = len(os.sched_getaffinity(0))
    workers = workers if workers is not None else ncpu
    if workers < 1:
        raise DelphiError(f"--workers: must be >= 1, got {workers}")
    if retries < 0:
        raise DelphiError(f"--retries: must be >= 0, got {retries}")
    rungs = load_rungs(ladder_dir, rows)
    total_flops = sum(r.flops for r in rungs)
    done = {r.run_id: rung_status(r.run_dir) for r in rungs if is_finished(rung_status(r.run_dir))}
    # Largest first: the long rungs start early and the short ones fill the gaps at the end.
    queue = sorted((r for r in rungs if r.run_id not in done), key=lambda r: -r.flops)
    flops_at_start = sum(r.flops for r in rungs if r.run_id in done)
    for d in (LOCKS_DIR, LOGS_DIR, RUNS_DIR):
        (ladder_dir / d).mkdir(parents=True, exist_ok=True)

    slots = core_slots(workers)
    free = list(range(workers))
    running: list[_Running] = []
    failed: dict[str, str] = {}
    started = time.perf_counter()
    last_report = 0.0

    def report(force: bool = False) -> None:
        nonlocal last_report
        now = time.perf_counter()
        if not progress or (not force and now - last_report < progress_every_s):
            return
        last_report = now
        finished = sum(r.flops for r in rungs if r.run_id in done)
        partial = sum(_last_flops(x.rung.run_dir) for x in running)
        flops_done = finished + partial
        rate = (flops_done - flops_at_start) / max(now - started, 1e-9)
        remaining = total_flops - flops_done - sum(r.flops for r in rungs if r.run_id in failed)
        line = progress_line(len(done), len(rungs), len(running), len(failed), flops_done, total_flops, rate,
                             now - started, remaining)
        print(line, file=sys.stderr, flush=True)

    def launch(rung: _Rung, slot: int) -> None:
        rung.attempts += 1
        cores = slots[slot]
        env = dict(os.environ)
        if len(cores) == 1:  # one core: no intra-op thread pool to fight over it
            env["XLA_FLAGS"] = (
                env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
            ).strip()
        log = open(ladder_dir / LOGS_DIR / f"{rung.run_id}.log", "a")
        log.write(f"--- attempt {rung.attempts} on cores {cores} at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        log.flush()
        proc = subprocess.Popen(
            [sys.executable, "-m", "delphi.ladder.runner", str(rung.config), str(rung.run_dir),
             str(ladder_dir / LOCKS_DIR / f"{rung.run_id}.lock"), ",".join(map(str, cores))],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        running.append(_Running(rung, proc, slot, time.perf_counter(), log))

    report(force=True)
    try:
        while queue or running:
            now = time.perf_counter()
            while free and any(r.not_before <= now for r in queue):
                rung = next(r for r in queue if r.not_before <= now)
                queue.remove(rung)
                launch(rung, free.pop(0))
            time.sleep(POLL_S)
            for job in list(running):
                code = job.proc.poll()
                if code is None:
                    continue
                running.remove(job)
                job.log.close()
                free.append(job.slot)
                rung = job.rung
                status = rung_status(rung.run_dir)
                if code == EXIT_LOCKED:
                    rung.attempts -= 1
                    rung.not_before = time.perf_counter() + LOCKED_RETRY_S
                    queue.append(rung)
                elif code in (EXIT_COMPLETED, EXIT_DIVERGED) and status in ("completed", "diverged"):
                    done[rung.run_id] = status
                    if progress:
                        print(f"[ladder] {rung.run_id}: {status} in {_format_s(time.perf_counter() - job.started)}",
                              file=sys.stderr, flush=True)
                    report(force=True)
                elif rung.attempts <= retries:
                    print(f"[ladder] {rung.run_id}: failed (exit {code}), retrying; see {LOGS_DIR}/{rung.run_id}.log",
                          file=sys.stderr, flush=True)
                    queue.append(rung)
                else:
                    failed[rung.run_id] = f"exit {code} after {rung.attempts} attempt(s); see {LOGS_DIR}/{rung.run_id}.log"
                    print(f"[ladder] {rung.run_id}: failed: {failed[rung.run_id]}", file=sys.stderr, flush=True)
            report()
    except BaseException:
        # Ctrl-C or an error here: stop the workers gracefully (the trainer checkpoints on SIGTERM).
        for job in running:
            if job.proc.poll() is None:
                job.proc.send_signal(signal.SIGTERM)
        for job in running:
            try:
                job.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                job.proc.kill()
            job.log.close()
        raise
    report(force=True)
    counts = {s: sum(1 for v in done.values() if v == s) for s in ("completed", "diverged")}
    return {
        "ladder": str(ladder_dir),
        "rungs": len(rungs),
        "completed": counts["completed"],
        "diverged": counts["diverged"],
        "failed": failed,
        "workers": workers,
        "flops_total": total_flops,
        "wall_s": round(time.perf_counter() - started, 3),
    }


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


def _worker(config: str, run_dir: str, lock_path: str, cores: str) -> int:
    """One rung in this worker process, pinned to `cores` (comma-separated; empty: no pinning)."""
    if cores:
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    return run_rung(config, run_dir, lock_path)


if __name__ == "__main__":
    sys.exit(_worker(*sys.argv[1:5]))
