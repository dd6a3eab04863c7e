"""Compact copies of a study directory: a study continued elsewhere, the paper's data."""

from __future__ import annotations

from pathlib import Path

from delphi.errors import DelphiError
from delphi.io import atomic_write_bytes
from delphi.ladder.driver import is_finished
from delphi.study.state import STUDY_FILE
from delphi.train.checkpoint import CorruptCheckpoint, list_checkpoints, read_manifest
from delphi.train.rundir import CONFIG_FILE, read_status

# Too big or too machine-bound to commit: a finished run's result is its config, status, summary
# and metrics; an unfinished run is left out whole and trains again wherever the study continues.
COMPACT_SKIP_DIRS = frozenset({"checkpoints", "logs", "locks", "__pycache__", "wandb"})


def compact_files(study_dir: str | Path, *, resumable: bool = False) -> list[Path]:
    """The files of a study directory worth committing, relative to it: everything but checkpoints,
    logs, locks and the run directories of runs that have not finished (completed or diverged).
    With `resumable` an unfinished run is kept too, with its newest complete checkpoint (one with
    a manifest), so that a fresh machine resumes it where it stopped rather than from step 0: a
    hero longer than one working session continues on the next."""
    study_dir = Path(study_dir)
    unfinished = {
        p.parent
        for p in study_dir.rglob(CONFIG_FILE)  # a run dir holds its config.yaml first
        if not is_finished((read_status(p.parent) or {}).get("status", "pending"))
    }
    newest: set[Path] = set()
    for run in unfinished if resumable else ():
        for _, path in reversed(list_checkpoints(run)):
            try:
                read_manifest(path)
            except CorruptCheckpoint:
                continue
            newest.add(path)
            break
    files = []
    for path in sorted(study_dir.rglob("*")):
        rel = path.relative_to(study_dir)
        if path.is_dir():
            continue
        if any(d in newest for d in path.parents):
            files.append(rel)
        elif COMPACT_SKIP_DIRS & set(rel.parts) or (not resumable and any(d in unfinished for d in path.parents)):
            continue
        else:
            files.append(rel)
    return files


def export_study(study_dir: str | Path, dest: str | Path, *, resumable: bool = False) -> list[str]:
    """Copy a study's compact data (`compact_files`) into `dest`, each file written atomically: a
    stage of a long study, committed as it completes. To continue on another machine, copy `dest`
    to a study directory and run the same `delphi study` command there; with `resumable`, an
    unfinished run (a hero mid-way) continues from its newest checkpoint."""
    study_dir, dest = Path(study_dir), Path(dest)
    if not (study_dir / STUDY_FILE).is_file():
        raise DelphiError(f"--from-study: {study_dir} is not a study directory (no {STUDY_FILE})")
    copied = []
    for rel in compact_files(study_dir, resumable=resumable):
        atomic_write_bytes(dest / rel, (study_dir / rel).read_bytes())
        copied.append(str(rel))
    return copied
