"""The one ladder driver loop, shared by every executor.

    LadderDriver(ladder_dir, retries=1).drive(placer) -> None;  .summary(**extra) -> dict

The driver owns what a ladder run means: which rungs are pending (a completed or
diverged rung is a result and is never rerun), in which order they start
(largest first), what a finished job means (done, locked elsewhere, retry,
failed), the progress line and the summary. An executor only places jobs: it
implements `Placer` (how many jobs it can take now, place one, wait for
outcomes, stop everything on Ctrl-C). `delphi.ladder.runner` places rungs on
local worker processes, `delphi.ladder.ray_executor` on Ray tasks.

Seed groups: with `group_seeds` (off by default: on a 2-core CPU the vmapped
program cost as much as the seeds alone and compiled slower, at every shape of the default ladder;
see benchmarks/ladder.py and benchmarks/seed_groups.py) and a placer that takes groups
(`place_group`), the pending rungs of one cell (configs equal but for their
seeds, see `cell_key`) are placed together as one job that trains them as one
vmapped program (`delphi.train.trainer.train_group`). The job still reports
one outcome per rung, so the skip, retry and summary rules stay per rung; a
member locked elsewhere is reported locked and comes back alone later, and a
rung whose group job failed is retried alone (a broken member cannot keep
failing its cell).

Every job runs `run_rung` or `run_group` (in delphi.ladder.runner), whose exit code (one per
rung) is the contract between a job and the driver: EXIT_COMPLETED, EXIT_DIVERGED,
EXIT_LOCKED (another process holds the rung's flock: come back later),
anything else a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from delphi.data.loader import TokenStore
from delphi.data.store import check_store_for_config
from delphi.errors import DelphiError
from delphi.io import read_yaml
from delphi.ladder.manifest import RUNS_DIR, SPEC_FILE, read_manifest
from delphi.ladder.spec import load_ladder_spec
from delphi.train.config import TrainConfig, load_train_config
from delphi.train.rundir import METRICS_FILE, read_status, summary_problem

LOCKS_DIR = "locks"
LOGS_DIR = "logs"
EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_DIVERGED = 3
EXIT_LOCKED = 75  # EX_TEMPFAIL: another process holds the rung
PROGRESS_EVERY_S = 30.0
LOCKED_RETRY_S = 5.0
FINISHED_STATUSES = ("completed", "diverged")
TAIL_BYTES = 8192  # enough for the last few metrics lines of a running rung
# What seeds of one cell may differ in (delphi.train.trainer.SEED_KEYS, as paths into the config file).
SEED_CONFIG_PATHS = (("seed",), ("name",), ("data", "seed"))


def rung_status(run_dir: Path) -> str:
    return (read_status(run_dir) or {}).get("status", "pending")


def is_finished(status: str) -> bool:
    """Skip rule shared by every executor: a completed or diverged rung is a result and never rerun."""
    return status in FINISHED_STATUSES


def last_flops(run_dir: Path) -> float:
    """FLOPs done so far by a running rung: the last complete line of its metrics.jsonl."""
    path = run_dir / METRICS_FILE
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            lines = f.read().splitlines()
    except OSError:
        return 0.0
    for line in reversed(lines):
        try:
            return float(json.loads(line).get("flops") or 0.0)
        except ValueError:
            continue
    return 0.0


def cell_key(config: Path) -> str | None:
    """The rung's config without its seeds (SEED_CONFIG_PATHS), as canonical JSON: rungs with equal
    keys can train as one seed group. None when it cannot be grouped (a multi-device mesh, or a
    config that does not read as a mapping; the trainer reports that one)."""

    try:
        raw = read_yaml(config)
    except DelphiError:
        return None
    if not isinstance(raw, dict):
        return None
    mesh = raw.get("mesh") or {}
    if isinstance(mesh, dict) and any(int(mesh.get(axis) or 1) != 1 for axis in ("data", "expert", "model")):
        return None
    for path in SEED_CONFIG_PATHS:
        node = raw
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return json.dumps(raw, sort_keys=True, default=str)


@dataclass
class Rung:
    run_id: str
    config: Path
    run_dir: Path
    flops: float
    seed: int = 0
    budget: float = 0.0  # the isoFLOP budget it belongs to (manifest.csv)
    attempts: int = 0
    not_before: float = 0.0  # perf_counter time before which it is not placed again (locked elsewhere)
    placed_at: float = 0.0  # epoch seconds of the last placement
    cell: str | None = None  # cell_key of its config: rungs with equal (non-None) cells may train together
    alone: bool = False  # set once a group job failed it: its retries train it alone


@dataclass(frozen=True)
class Outcome:
    """What became of one placed job."""

    rung: Rung
    code: int | None  # run_rung's exit code; None when the job died or raised before giving one
    why: str  # for messages: "exit 1", "exit 1 on node3", "RayTaskError: ..."


class Placer(Protocol):
    """Where jobs run. The driver decides what runs and what an outcome means."""

    def free_slots(self) -> int:
        """How many more jobs it takes now."""

    def place(self, rung: Rung, lock_path: Path, log_path: Path) -> None:
        """Start `run_rung(rung.config, rung.run_dir, lock_path)` with its output appended to `log_path`."""

    # Optional: a placer with `place_group(rungs, lock_paths, log_paths)` (one job training the rungs
    # as one seed group via `run_group`, one Outcome per rung) gets seed groups from the driver.

    def wait(self, timeout_s: float) -> list[Outcome]:
        """The jobs that ended, waiting at most `timeout_s` for the first one."""

    def in_flight_note(self, rungs: list[Rung]) -> tuple[int, str]:
        """(how many placed rungs are training, a suffix for the progress line)."""

    def stop(self) -> None:
        """Ctrl-C or an error in the driver: interrupt every job (they checkpoint) and wait for them."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler, `kill`) and SIGHUP stop the driver as Ctrl-C does, through `Placer.stop`: every
    rung checkpoints and exits with it. Python's default SIGTERM would end the driver at once and leave
    its workers training with no one to report to. The driver is plain Python between polls, so
    raising here is safe, unlike in the trainer (`delphi.train.interrupt`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # SIGHUP too: a closed terminal (an ssh session dropped) must not orphan the workers either.
    previous = {s: signal.signal(s, _raise) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def load_rungs(ladder_dir: Path, rows: list[dict[str, str]] | None = None) -> list[Rung]:
    """The manifest's rungs, each with its config (which must exist) and run dir."""
    rows = read_manifest(ladder_dir) if rows is None else rows
    rungs = []
    for row in rows:
        config = ladder_dir / row["config"]
        if not config.is_file():
            raise DelphiError(f"{ladder_dir}/manifest.csv: rung {row['run_id']}: config {config} is missing")
        seed = int(row.get("seed") or 0)
        rungs.append(
            Rung(
                row["run_id"],
                config,
                ladder_dir / RUNS_DIR / row["run_id"],
                float(row["flops"]),
                seed,
                budget=float(row.get("budget") or 0.0),
                cell=cell_key(config),
            )
        )
    return rungs


def placement_order(rungs: list[Rung]) -> list[Rung]:
    """Largest first, so the long rungs start early and the short ones fill the gaps at the end;
    the first seed of every rung before any second seed, so that a later seed (same program, other
    init and data order) finds its program in the persistent compilation cache instead of
    compiling it at the same time on the next worker."""
    seeds = sorted({r.seed for r in rungs})
    return sorted(rungs, key=lambda r: (seeds.index(r.seed), -r.flops))


def format_s(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def progress_line(
    rungs_done: int,
    rungs: int,
    running: int,
    failed: int,
    flops_done: float,
    flops_total: float,
    flops_per_s: float,
    elapsed_s: float,
    flops_left: float,
) -> str:
    """`[ladder] 3/20 rungs done (2 running, 0 failed), FLOPs done/total, rate, elapsed, ETA`."""
    eta = format_s(flops_left / flops_per_s) if flops_per_s > 0 else "?"
    return (
        f"[ladder] {rungs_done}/{rungs} rungs done ({running} running, {failed} failed), "
        f"{flops_done:.3g}/{flops_total:.3g} FLOPs ({flops_done / max(flops_total, 1e-30):.0%}), "
        f"{flops_per_s / 1e9:.1f} GFLOP/s, elapsed {format_s(elapsed_s)}, ETA {eta}"
    )


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def select_budgets(rungs: list[Rung], budgets: tuple[float, ...] | None) -> list[Rung]:
    """The rungs of `budgets` (each matched to 1e-6 relative); a budget the ladder lacks is an error."""
    if budgets is None:
        return rungs
    planned = sorted({r.budget for r in rungs})
    matches = lambda b, c: abs(b / c - 1) <= 1e-6  # noqa: E731
    for b in budgets:
        if not any(matches(b, c) for c in planned):
            raise DelphiError(
                f"--budgets: {b:g} is not a budget of this ladder (its budgets: {', '.join(f'{c:g}' for c in planned)})"
            )
    return [r for r in rungs if any(matches(r.budget, b) for b in budgets)]


def check_store(ladder_dir: Path, rungs: list[Rung]) -> None:
    """Before any rung is placed: the store of every rung about to train can feed it (batch,
    evaluation windows, vocabulary) within the ladder spec's run.max_epochs (its ladder.yaml; no
    limit without one): `check_ladder_store`, a DelphiError naming the rung.
    A config that does not read is left to its rung, which fails alone in its worker."""

    runs = []
    for rung in rungs:
        try:
            runs.append((rung.run_id, load_train_config(rung.config)))
        except DelphiError:
            continue
    if not runs:
        return
    pinned = ladder_dir / SPEC_FILE
    spec = load_ladder_spec(pinned) if pinned.is_file() else None
    where = pinned if spec is not None else ladder_dir
    check_ladder_store(runs, spec.run.max_epochs if spec is not None else None, where=str(where))


@dataclass
class LadderDriver:
    """One pass over a ladder dir: skip, order, place, judge outcomes, report, summarise."""

    ladder_dir: Path
    retries: int = 1
    progress: bool = True
    progress_every_s: float = PROGRESS_EVERY_S
    group_seeds: bool = False  # seeds of one cell as one job, where the placer takes groups
    # Only these budgets' rungs (None: all): a long ladder run in stages, one commit per stage.
    budgets: tuple[float, ...] | None = None
    rungs: list[Rung] = field(init=False)
    done: dict[str, str] = field(init=False)  # run_id -> completed | diverged
    waiting: list[Rung] = field(init=False)
    failed: dict[str, str] = field(default_factory=dict, init=False)
    in_flight: dict[str, Rung] = field(default_factory=dict, init=False)
    # run_id -> {"placed_at": epoch s, "wall_s": placement to outcome, "attempts"}: the last attempt
    rung_times: dict[str, dict] = field(default_factory=dict, init=False)
    wall_s: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.ladder_dir = Path(self.ladder_dir)
        if self.retries < 0:
            raise DelphiError(f"--retries: must be >= 0, got {self.retries}")
        self.rungs = select_budgets(load_rungs(self.ladder_dir), self.budgets)
        statuses = {r.run_id: rung_status(r.run_dir) for r in self.rungs}
        # A finished rung whose summary.json is damaged is no result (`ladder collect` refuses it):
        # failed, named, and not trained again (its status says it finished; a person decides).
        for r in self.rungs:
            if is_finished(statuses[r.run_id]) and (problem := summary_problem(r.run_dir, statuses[r.run_id])):
                self.failed[r.run_id] = f"{problem}; restore it, or delete {r.run_dir} to train the rung again"
                statuses[r.run_id] = "failed"
                if self.progress:
                    _say(f"[ladder] {r.run_id}: failed: {self.failed[r.run_id]}")
        self.done = {run_id: s for run_id, s in statuses.items() if is_finished(s)}
        self.waiting = placement_order(
            [r for r in self.rungs if r.run_id not in self.done and r.run_id not in self.failed]
        )
        check_store(self.ladder_dir, self.waiting)
        self._started = time.perf_counter()
        self._last_report = 0.0
        self._flops_at_start = 0.0

    @property
    def total_flops(self) -> float:
        return sum(r.flops for r in self.rungs)

    def make_dirs(self) -> None:
        for d in (LOCKS_DIR, LOGS_DIR, RUNS_DIR):
            (self.ladder_dir / d).mkdir(parents=True, exist_ok=True)

    def log_path(self, rung: Rung) -> Path:
        return self.ladder_dir / LOGS_DIR / f"{rung.run_id}.log"

    def lock_path(self, rung: Rung) -> Path:
        return self.ladder_dir / LOCKS_DIR / f"{rung.run_id}.lock"

    # ---- progress

    def _flops_done(self) -> float:
        finished = sum(r.flops for r in self.rungs if r.run_id in self.done)
        partial = sum(
            last_flops(r.run_dir) for r in self.rungs if r.run_id not in self.done and r.run_id not in self.failed
        )
        return finished + partial

    def report(self, placer: Placer, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.progress or (not force and now - self._last_report < self.progress_every_s):
            return
        self._last_report = now
        flops_done = self._flops_done()
        # A resumed rung rewinds its metrics to its checkpoint, so the FLOPs done can fall once.
        self._flops_at_start = min(self._flops_at_start, flops_done)
        rate = (flops_done - self._flops_at_start) / max(now - self._started, 1e-9)
        left = self.total_flops - flops_done - sum(r.flops for r in self.rungs if r.run_id in self.failed)
        training, note = placer.in_flight_note(list(self.in_flight.values()))
        line = progress_line(
            len(self.done),
            len(self.rungs),
            training,
            len(self.failed),
            flops_done,
            self.total_flops,
            rate,
            now - self._started,
            left,
        )
        _say(line + note)

    # ---- the loop

    def drive(self, placer: Placer, poll_s: float) -> None:
        """Place every waiting rung and judge its outcome until none is left (or Ctrl-C, SIGTERM)."""
        self._started = time.perf_counter()
        self._flops_at_start = self._flops_done()
        self.report(placer, force=True)
        try:
            with sigterm_as_interrupt():
                self._drive(placer, poll_s)
        except BaseException:
            placer.stop()
            raise
        finally:
            self.wall_s = time.perf_counter() - self._started
        self.report(placer, force=True)

    def _drive(self, placer: Placer, poll_s: float) -> None:
        while self.waiting or self.in_flight:
            now = time.perf_counter()
            for rung in [r for r in self.waiting if r.not_before <= now]:
                if rung not in self.waiting:  # placed just now with its group
                    continue
                if placer.free_slots() <= 0:
                    break
                group = self.group_of(rung, placer, now)
                for member in group:
                    self.waiting.remove(member)
                    member.attempts += 1
                    member.placed_at = time.time()
                    self.in_flight[member.run_id] = member
                if len(group) == 1:
                    placer.place(rung, self.lock_path(rung), self.log_path(rung))
                else:
                    placer.place_group(group, [self.lock_path(r) for r in group], [self.log_path(r) for r in group])
            for outcome in placer.wait(poll_s):
                self.judge(outcome, placer)
            self.report(placer)

    def pending_jobs(self) -> int:
        """How many jobs the waiting rungs make (a seed group is one job)."""
        if not self.group_seeds:
            return len(self.waiting)
        return len({r.cell if r.cell is not None and not r.alone else r.run_id for r in self.waiting})

    def group_of(self, rung: Rung, placer: Placer, now: float) -> list[Rung]:
        """`rung` and the waiting rungs of its cell that may start now, in placement order."""
        if not self.group_seeds or rung.alone or rung.cell is None or not hasattr(placer, "place_group"):
            return [rung]
        return [rung] + [
            r for r in self.waiting if r is not rung and r.cell == rung.cell and not r.alone and r.not_before <= now
        ]

    def judge(self, outcome: Outcome, placer: Placer) -> None:
        """The retry and skip rules, for every executor."""
        rung = self.in_flight.pop(outcome.rung.run_id)
        wall_s = time.time() - rung.placed_at
        self.rung_times[rung.run_id] = {
            "placed_at": rung.placed_at,
            "wall_s": round(wall_s, 3),
            "attempts": rung.attempts,
        }
        log = f"{LOGS_DIR}/{rung.run_id}.log"
        status = rung_status(rung.run_dir)
        # EXIT_LOCKED with a finished status: another process finished the rung meanwhile.
        if outcome.code in (EXIT_COMPLETED, EXIT_DIVERGED, EXIT_LOCKED) and is_finished(status):
            self.done[rung.run_id] = status
            if self.progress:
                _say(f"[ladder] {rung.run_id}: {status} in {format_s(wall_s)}")
            self.report(placer, force=True)
        elif outcome.code == EXIT_LOCKED:  # a live process elsewhere holds the rung: come back to it later
            rung.attempts -= 1
            rung.not_before = time.perf_counter() + LOCKED_RETRY_S
            self.waiting.append(rung)
        elif rung.attempts <= self.retries:
            _say(f"[ladder] {rung.run_id}: failed ({outcome.why}), retrying; see {log}")
            rung.alone = True
            self.waiting.append(rung)
        else:
            self.failed[rung.run_id] = f"{outcome.why} after {rung.attempts} attempt(s); see {log}"
            _say(f"[ladder] {rung.run_id}: failed: {self.failed[rung.run_id]}")

    def summary(self, **extra: object) -> dict:
        counts = {s: sum(1 for v in self.done.values() if v == s) for s in FINISHED_STATUSES}
        return {
            "ladder": str(self.ladder_dir),
            "rungs": len(self.rungs),
            "completed": counts["completed"],
            "diverged": counts["diverged"],
            "failed": dict(self.failed),
            **extra,
            "flops_total": self.total_flops,
            "wall_s": round(self.wall_s, 3),
            "rung_times": dict(self.rung_times),
        }


def check_ladder_store(
    runs: list[tuple[str, TrainConfig]], max_epochs: float | None, where: str = ""
) -> dict[str, float]:
    """Epochs of its store each run reads (run id -> epochs), checked where training starts (`ladder
    run`, a study's ladder stage): DelphiError when a store's bytes or vocabulary are not what a run
    needs (`delphi.data.store.check_store_for_config`), it cannot feed a run's batches and evaluation
    windows (`TokenStore.check_feeds`), or a run would read more than `max_epochs` passes over its
    train split (run.max_epochs; None: no limit). `ladder plan` reads no store."""

    prefix = f"{where}: " if where else ""
    stores: dict[Path, TokenStore] = {}
    epochs = {}
    for run_id, cfg in runs:
        name = cfg.data.store
        at = f"{prefix}run.store ({run_id})"
        store_dir = check_store_for_config(cfg, where=at)
        store = stores[store_dir] if store_dir in stores else stores.setdefault(store_dir, TokenStore(store_dir))
        store.check_feeds(**cfg.store_needs(), where=at)
        e = store.epochs(cfg.steps, cfg.data.batch_size, cfg.data.seq_len)
        if max_epochs is not None and e > max_epochs:
            tokens = cfg.steps * cfg.data.batch_size * cfg.data.seq_len
            raise DelphiError(
                f"{prefix}run.max_epochs: rung {run_id} reads {e:.3g} epochs of {name} "
                f"({tokens:,} tokens; run.max_epochs is {max_epochs:g}); lower the budgets or use a larger store"
            )
        epochs[run_id] = e
    return epochs
