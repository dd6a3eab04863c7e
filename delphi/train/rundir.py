"""The run directory: status.json, metrics.jsonl and the W&B mirror.

Every file is either written atomically (status, summary, config) or appended
one flushed line at a time (metrics), so a reader following a live run never
sees a partial object.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Literal

from delphi.io import atomic_write_json, atomic_write_text

Status = Literal["pending", "running", "completed", "diverged", "failed"]
METRICS_FILE = "metrics.jsonl"
STATUS_FILE = "status.json"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.yaml"


def write_status(run_dir: Path, status: Status, step: int, reason: str = "") -> None:
    atomic_write_json(
        Path(run_dir) / STATUS_FILE,
        {"status": status, "reason": reason, "step": step, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
    )


def read_status(run_dir: Path) -> dict | None:
    path = Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _finite_or_none(value: Any) -> Any:
    # JSON has no NaN/inf; a diverged step is logged as null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:  # a torn last line after a hard kill
            break
    return records


class MetricsLog:
    """metrics.jsonl: one JSON object per logged step, flushed line by line."""

    def __init__(self, run_dir: Path, *, keep_through_step: int | None = None) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        if keep_through_step is None:
            atomic_write_text(self.path, "")
        else:
            # Resuming from a checkpoint: drop what was logged after it (it is recomputed).
            kept = [r for r in read_metrics(run_dir) if r.get("step", 0) <= keep_through_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file = open(self.path, "a")

    def write(self, record: dict) -> None:
        self._file.write(json.dumps({k: _finite_or_none(v) for k, v in record.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def wandb_mode(configured: str | None) -> str:
    """The config's mode, else WANDB_MODE, else disabled (no account, no network)."""
    return configured or os.environ.get("WANDB_MODE") or "disabled"


class WandbLog:
    """Mirror of metrics.jsonl in Weights & Biases; a no-op (wandb not imported) when disabled."""

    def __init__(self, mode: str, *, project: str, entity: str | None, name: str | None, config: dict, run_dir: Path) -> None:
        self.run = None
        if mode == "disabled":
            return
        import wandb  # slow import: only when it is used

        self.run = wandb.init(
            mode=mode, project=project, entity=entity, name=name, config=config, dir=str(run_dir)
        )

    def write(self, record: dict) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in record.items() if k != "step" and v is not None}, step=record["step"])

    def close(self, summary: dict | None = None) -> None:
        if self.run is not None:
            if summary:
                self.run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
            self.run.finish()
