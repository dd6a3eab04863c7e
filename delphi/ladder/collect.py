"""Collecting a ladder's runs into the results table that `delphi fit` reads.

One row per rung of the manifest, with the canonical columns first (DESIGN.md
section 3): params (N, active non-embedding), tokens (D), flops (C, exact),
loss (final validation loss, nats per byte-token), budget, run_id, experts,
granularity; then status, bpb, the 6ND FLOPs, every parameter count, the shape
and the transferred hyperparameters. By default only completed rungs are
written (a fit must not see a half-trained or diverged run); `include_all`
adds the others with an empty loss.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd

from delphi.io import atomic_write_text
from delphi.ladder.plan import RUNS_DIR, read_manifest
from delphi.ladder.runner import rung_status

CANONICAL_COLUMNS = ("params", "tokens", "flops", "loss", "budget", "run_id", "experts", "granularity")
EXTRA_COLUMNS = (
    "status", "bpb", "seed", "flops_6nd", "flops_planned", "params_active", "params_total", "params_nonembedding",
    "steps", "batch_size", "batch_tokens", "seq_len", "d_model", "n_layers", "n_heads", "d_head", "d_ff", "top_k",
    "d_expert", "shared_experts", "lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip", "schedule",
    "warmup_frac", "decay_frac", "tokens_per_param", "wall_time_s", "data_sha256", "config_sha256",
)
RESULT_COLUMNS = CANONICAL_COLUMNS + EXTRA_COLUMNS


def _summary(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def _number(text: str | None) -> object:
    """Manifest cells are text: give numbers back their type."""
    if text is None or text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def collect_ladder(ladder_dir: str | Path, *, include_all: bool = False) -> pd.DataFrame:
    ladder_dir = Path(ladder_dir)
    rows = []
    for m in read_manifest(ladder_dir):
        run_dir = ladder_dir / RUNS_DIR / m["run_id"]
        status = rung_status(run_dir)
        summary = _summary(run_dir) if status in ("completed", "diverged") else {}
        loss = summary.get("val_loss")
        complete = status == "completed" and loss is not None and math.isfinite(float(loss))
        if not (complete or include_all):
            continue
        tokens = int(summary["tokens"]) if complete else int(float(m["tokens"]))
        params = int(m["params"])
        row = {
            "params": params,
            "tokens": tokens,
            "flops": float(summary["flops"]) if complete else float(m["flops"]),
            "loss": float(loss) if complete else None,
            "budget": float(m["budget"]),
            "run_id": m["run_id"],
            "experts": int(m["experts"]),
            "granularity": float(m["granularity"]),
            "status": status,
            "bpb": summary.get("val_bpb") if complete else None,
            "flops_6nd": 6.0 * params * tokens,
            "flops_planned": float(m["flops"]),
            "tokens_per_param": tokens / params,
            "wall_time_s": summary.get("wall_time_s"),
            "data_sha256": summary.get("data_sha256"),
            "config_sha256": summary.get("config_sha256"),
        }
        for key in EXTRA_COLUMNS:
            if key not in row:
                row[key] = _number(m.get(key))
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    return frame


def write_results(frame: pd.DataFrame, out: str | Path) -> None:
    buf = io.StringIO()
    frame.to_csv(buf, index=False, float_format="%.10g")
    atomic_write_text(out, buf.getvalue())
