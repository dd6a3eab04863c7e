"""The run directory: status.json, metrics.jsonl, the W&B mirror and the run lock.

Every file is either written atomically (status, summary, config) or appended
one flushed line at a time (metrics), so a reader following a live run never
sees a partial object. One trainer at a time holds `train.lock` (an flock) while
it writes the directory.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

from delphi.errors import DelphiError, quoted
from delphi.io import atomic_write_json, atomic_write_text, read_text
from delphi.train.environment import wandb_mode as checked

Status = Literal["pending", "running", "completed", "diverged", "failed"]
METRICS_FILE = "metrics.jsonl"
STATUS_FILE = "status.json"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.yaml"
CHECKPOINTS_DIR = "checkpoints"  # the trainer's checkpoints (delphi.train.checkpoint)
LOCK_FILE = "train.lock"  # exists only while a trainer holds it (removed on release)
# The unit of every loss a run reports (metrics, summary); val_bpb is the same loss in bits per byte
# of text (nats per token x tokens / bytes / ln 2), which compares across tokenizers.
LOSS_UNIT = "nats/token"


def warn(message: str) -> None:
    """One clean line on stderr (no Python warning machinery, no source line)."""
    print(f"delphi: warning: {message}", file=sys.stderr, flush=True)


class RunLock:
    """An exclusive flock on run_dir/train.lock for the whole training: a second trainer on the
    same run directory is refused instead of interleaving its writes. The kernel drops the lock
    when the process dies (even by SIGKILL); the file is removed on a clean release.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._file = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            f = open(self.path, "a+")
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                f.close()
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                raise _held_elsewhere(self.path) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:  # else the holder removed the file between our open and flock: try again
                break
            f.close()
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        if self._file is not None:
            self.path.unlink(missing_ok=True)  # before unlocking: a waiter re-checks the inode
            self._file.close()
            self._file = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _held_elsewhere(path: Path) -> DelphiError:
    return DelphiError(
        f"--out: {path.parent} is being trained by another process (it holds {path}); "
        "wait for it to finish or use another directory"
    )


def check_not_locked(run_dir: Path) -> None:
    """DelphiError if another process holds run_dir's lock now; creates nothing (a trainer asks
    before its slower checks, and takes the lock itself after them)."""
    path = Path(run_dir) / LOCK_FILE
    try:
        f = open(path)
    except OSError:
        return
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise _held_elsewhere(path) from None
            raise


def clear_stale_lock(run_dir: Path) -> bool:
    """Remove run_dir/train.lock if no live process holds it (its holder was killed: the kernel
    dropped the flock but the file stays); True if removed."""
    path = Path(run_dir) / LOCK_FILE
    try:
        f = open(path, "r+")
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: a live trainer
        try:
            same = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            return False
        if same:
            path.unlink(missing_ok=True)  # under the flock, as RunLock.release does
        return same


def lock_pid(run_dir: Path) -> int | None:
    """The pid a run's train.lock records (RunLock writes it on acquiring), or None: no lock file,
    or one without a pid (being written, or damaged)."""
    try:
        text = (Path(run_dir) / LOCK_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    first = text.strip().split("\n", 1)[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this machine (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another account
    try:  # a zombie (dead, not yet reaped by its parent) holds no lock and writes nothing
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def stale_running(run_dir: Path) -> str | None:
    """Why a run whose status.json says `running` is not running any more, or None while it may be.

    A trainer killed by a signal no handler runs for (SIGKILL) leaves
    `status: running` and its train.lock, which records the trainer's pid: when that process is
    gone, the status is stale. Only this machine's processes are known: a lock without a pid, or
    a pid that is alive (possibly reused by another process), reads as running. No flock is taken,
    so a reader never races a trainer that is acquiring its lock. For `prereg check --watch`, which
    otherwise polls such a run until its timeout."""
    run_dir = Path(run_dir)
    if (read_status(run_dir) or {}).get("status") != "running":
        return None
    pid = lock_pid(run_dir)
    if pid is None or pid_alive(pid):
        return None
    return (
        f"{run_dir}: status.json says running but its trainer (pid {pid}, recorded in {run_dir / LOCK_FILE}) "
        "is gone: it was killed without recording it; continue it with `delphi train --resume`"
    )


def signal_death_reason(signum: int) -> str:
    """Why a trainer process died of signal `signum`, for a status reason (with the resume hint)."""
    import signal

    name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else f"signal {signum}"
    why = {
        "SIGABRT": "an abort inside the runtime (XLA), e.g. out of memory; its message is in the process's stderr",
        "SIGKILL": "killed outright: the kernel's out-of-memory killer, or kill -9",
        "SIGSEGV": "a crash inside native code",
        "SIGBUS": "a crash inside native code",
    }.get(name, "")
    return f"the trainer process died of {name} (exit {128 + signum}{'; ' + why if why else ''}); {RESUME_HINT}"


def record_death(run_dir: Path, reason: str) -> bool:
    """After the trainer of `run_dir` died without writing its end (a signal no handler can catch,
    e.g. SIGABRT from C++ or SIGKILL): status `failed` with `reason` if the status still says
    pending or running, and no stale train.lock. Done by the process that waited for it (the
    `delphi train` supervisor, the ladder runner). True if the status was changed."""
    status = read_status(run_dir) or {}
    changed = status.get("status") in ("pending", "running")
    if changed:
        write_status(run_dir, "failed", int(status.get("step") or 0), reason)
    clear_stale_lock(run_dir)
    return changed


def write_status(run_dir: Path, status: Status, step: int, reason: str = "") -> None:
    atomic_write_json(
        Path(run_dir) / STATUS_FILE,
        {"status": status, "reason": reason, "step": step, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
    )


def read_json_object(path: Path) -> dict:
    """A run-dir JSON file that may be mid-replace: {} when absent, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_status(run_dir: Path) -> dict | None:
    return read_json_object(Path(run_dir) / STATUS_FILE) or None


# How a run stopped before its end (a signal, max_steps) ends its status reason: it is "failed" for
# the ladder's bookkeeping but resumable, and no verdict on a prediction (`stopped_before_end`).
RESUME_HINT = "continue with --resume"


def stopped_before_end(status: dict) -> bool:
    """A status.json of a run stopped before its end, which `--resume` continues."""
    return status.get("status") == "failed" and str(status.get("reason") or "").endswith(RESUME_HINT)


def read_summary(run_dir: Path) -> dict:
    return read_json_object(Path(run_dir) / SUMMARY_FILE)


def summary_problem(run_dir: Path, status: str) -> str | None:
    """Why the summary.json of a run whose status.json says `status` ("completed", "diverged")
    cannot be used, or None when it can. The trainer writes the summary before the status, so a
    finished run without a readable summary (or a completed one without a finite val_loss) was
    damaged afterwards: its result is lost, and must not be counted or silently dropped."""
    path = Path(run_dir) / SUMMARY_FILE
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return f"{path} is missing although status.json says {status}"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        why = (
            e.strerror
            if isinstance(e, OSError)
            else ("not UTF-8 text" if isinstance(e, UnicodeDecodeError) else "not valid JSON")
        )
        return f"{path} is corrupt ({why}) although status.json says {status}"
    if not isinstance(data, dict):
        return f"{path} holds {type(data).__name__}, expected a JSON object"
    loss = data.get("val_loss")
    if status == "completed" and (
        isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss)
    ):
        return f"{path}: val_loss = {quoted(loss)}, expected a finite number for a completed run"
    return summary_log_problem(run_dir) if status == "completed" else None


def _finite_or_none(value: Any) -> Any:
    # JSON has no NaN/inf; a diverged step is logged as null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of a run's metrics.jsonl. The one torn-line rule: a last line that does not parse
    is skipped (a live run is writing it, or a hard kill cut it); a bad line before it is an error."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []

    rows = []
    lines = read_text(path, what="metrics file").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if i == len(lines) - 1:
                break
            raise DelphiError(f"{path}:{i + 1}: not valid JSON") from None
        if not isinstance(row, dict):
            raise DelphiError(f"{path}:{i + 1}: expected one JSON object per line, got {type(row).__name__}")
        rows.append(row)
    return rows


class MetricsLog:
    """metrics.jsonl: one JSON object per logged step, flushed line by line.

    If the file is deleted, replaced or truncated while the run writes it, it is recreated with
    every record of the run so far (they are kept in memory: one small dict per logged step) and
    a warning is printed once. `enabled=False` (processes other than 0) writes nothing."""

    def __init__(self, run_dir: Path, *, keep_through_step: int | None = None, enabled: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.enabled = enabled
        self._lines: list[str] = []
        self._file = None
        self._warned = False
        if not enabled:
            return
        if keep_through_step is not None:
            # Resuming from a checkpoint: drop what was logged after it (it is recomputed).
            kept = [r for r in read_metrics(run_dir) if r.get("step", 0) <= keep_through_step]
            self._lines = [json.dumps(r) + "\n" for r in kept]
        self._reopen()

    def _reopen(self) -> None:
        if self._file is not None:
            self._file.close()
        atomic_write_text(self.path, "".join(self._lines))
        self._file = open(self.path, "a")
        self._bytes = sum(len(line.encode()) for line in self._lines)

    def _intact(self) -> bool:
        try:
            on_disk = os.stat(self.path)
        except FileNotFoundError:
            return False
        ours = os.fstat(self._file.fileno())
        return on_disk.st_ino == ours.st_ino and on_disk.st_size >= self._bytes

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps({k: _finite_or_none(v) for k, v in record.items()}) + "\n"
        if not self._intact():
            if not self._warned:
                warn(
                    f"{self.path} was deleted or changed while training; recreated it with the "
                    f"{len(self._lines)} records logged so far"
                )
                self._warned = True
            self._reopen()
        self._lines.append(line)
        self._file.write(line)
        self._file.flush()
        self._bytes += len(line.encode())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def wandb_mode(configured: str | None) -> str:
    """The config's mode, else WANDB_MODE, else disabled (no account, no network); an unknown
    WANDB_MODE is a DelphiError naming it (delphi.train.environment)."""
    return checked(configured)


class WandbLog:
    """Mirror of metrics.jsonl in Weights & Biases; a no-op (wandb not imported) when disabled."""

    def __init__(
        self, mode: str, *, project: str, entity: str | None, name: str | None, config: dict, run_dir: Path
    ) -> None:
        self.run = None
        if mode == "disabled":
            return
        import wandb  # slow import: only when it is used

        self.run = wandb.init(mode=mode, project=project, entity=entity, name=name, config=config, dir=str(run_dir))

    def write(self, record: dict) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in record.items() if k != "step" and v is not None}, step=record["step"])

    def close(self, summary: dict | None = None) -> None:
        if self.run is not None:
            if summary:
                self.run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
            self.run.finish()


# A summary's val_loss and the metrics log's final eval are the same float written twice: any
# difference beyond JSON's round trip means one of them was edited.
RECORDS_REL_TOLERANCE = 1e-9


def final_eval_loss(rows: list[dict], steps: int | None = None) -> float | None:
    """The final val_loss a run's own metrics log records: the last eval row's loss on the final
    evaluation set (`val_loss_final_set`), else its `val_loss`; None when the log has no eval at
    `steps` (the run's last step, when given)."""
    for row in reversed(rows):
        if row.get("val_loss") is None and row.get("val_loss_final_set") is None:
            continue
        if steps is not None and row.get("step") != steps:
            return None
        value = row.get("val_loss_final_set", row.get("val_loss"))
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return None


def records_disagree(recorded: float, from_log: float | None) -> bool:
    return from_log is not None and abs(float(recorded) - from_log) > RECORDS_REL_TOLERANCE * max(abs(from_log), 1.0)


def summary_log_problem(run_dir: Path) -> str | None:
    """Why a completed run's summary.json disagrees with its own metrics log (None: it agrees, or the
    log has no final eval to compare): an edited summary must not change a verdict or a table."""
    summary = read_json_object(Path(run_dir) / SUMMARY_FILE)
    loss = summary.get("val_loss")
    if summary.get("status", "completed") != "completed" or not isinstance(loss, (int, float)):
        return None
    steps = summary.get("steps")
    from_log = final_eval_loss(read_metrics(run_dir), int(steps) if isinstance(steps, int) else None)
    if records_disagree(loss, from_log):
        return (
            f"{Path(run_dir) / SUMMARY_FILE}: val_loss = {loss!r} disagrees with {METRICS_FILE}'s final eval "
            f"({from_log!r}); the summary was edited or the log replaced"
        )
    return None
