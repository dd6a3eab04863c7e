"""Compare a (possibly still training) run with its preregistration.

Verdicts and exit codes (DESIGN.md section 3: 0 ok, 1 the checked thing failed):

    not-started  no eval point yet                                   exit 0
    on-track     latest eval point inside the 90% band or within     exit 0
                 the tolerance of the trajectory's median
    deviating    latest eval point outside both                      exit 1
    passed       run completed, final val_loss within tolerance      exit 0
    failed       run completed outside tolerance, or diverged/failed exit 1

Deviating exits 1 so that a monitor alarms; with --watch only the final verdict
sets the exit code.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError
from delphi.fits.curves import read_metrics
from delphi.io import atomic_write_json
from delphi.prereg import format as fmt
from delphi.prereg.create import parse_utc, utc_now

TERMINAL = ("completed", "diverged", "failed")
EXIT = {"not-started": 0, "on-track": 0, "passed": 0, "deviating": 1, "failed": 1}


@dataclass
class RunState:
    """What a check needs from a run, wherever it came from (run dir or W&B)."""

    source: str
    status: str  # pending | running | completed | diverged | failed | unknown
    rows: list[dict]  # metrics rows in step order
    final_loss: float | None = None  # summary's val_loss once completed
    final_bpb: float | None = None
    first_step_time: float | None = None  # epoch seconds of the first logged step
    reason: str | None = None


def first_step_time(run_dir: Path, rows: list[dict]) -> float | None:
    """When the first step was logged: its own timestamp if the row has one, else
    the metrics file's mtime minus the wall time elapsed since the first row
    (the file is flushed per line, so its mtime is the last row's time)."""
    if not rows:
        return None
    for key in ("time", "timestamp"):
        if isinstance(rows[0].get(key), (int, float)):
            return float(rows[0][key])
    mtime = (run_dir / "metrics.jsonl").stat().st_mtime
    first, last = rows[0].get("wall_s"), rows[-1].get("wall_s")
    if isinstance(first, (int, float)) and isinstance(last, (int, float)):
        return mtime - (float(last) - float(first))
    return mtime if len(rows) == 1 else None


def read_run_dir(run_dir: str | Path) -> RunState:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise DelphiError(f"{run_dir}: run dir not found")
    status = {}
    if (run_dir / "status.json").is_file():
        try:
            status = json.loads((run_dir / "status.json").read_text())
        except json.JSONDecodeError:
            status = {}  # being replaced right now; the next poll reads it
    rows = read_metrics(run_dir / "metrics.jsonl")
    summary = {}
    if (run_dir / "summary.json").is_file():
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except json.JSONDecodeError:
            summary = {}
    return RunState(
        source=str(run_dir),
        status=status.get("status", "pending" if not rows else "unknown"),
        rows=rows,
        final_loss=summary.get("val_loss"),
        final_bpb=summary.get("val_bpb"),
        first_step_time=first_step_time(run_dir, rows),
        reason=status.get("reason"),
    )


# W&B run states -> run dir statuses.
WANDB_STATES = {"running": "running", "finished": "completed", "crashed": "failed", "failed": "failed", "killed": "failed", "pending": "pending"}


def read_wandb(path: str) -> RunState:
    """A run through the W&B public API: ENTITY/PROJECT/RUN; offline → DelphiError (exit 2)."""
    if path.count("/") != 2 or not all(path.split("/")):
        raise DelphiError(f"--wandb {path}: expected ENTITY/PROJECT/RUN")
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        raise DelphiError(f"--wandb {path}: W&B is offline (WANDB_MODE={os.environ['WANDB_MODE']}); use --run RUN_DIR")
    try:
        import wandb

        api = wandb.Api(timeout=15)
        run = api.run(path)
        rows = [dict(r) for r in run.scan_history(keys=None)]
        state = WANDB_STATES.get(run.state, "unknown")
        summary = dict(run.summary)
        created = parse_utc(run.created_at + ("Z" if not str(run.created_at).endswith("Z") else "")) if run.created_at else None
    except DelphiError:
        raise
    except Exception as e:  # no network, no API key, no such run: all bad input here
        raise DelphiError(f"--wandb {path}: cannot read the run from W&B ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); offline? use --run RUN_DIR") from None
    rows = sorted((r for r in rows if "step" in r or "_step" in r), key=lambda r: r.get("step", r.get("_step")))
    for r in rows:
        r.setdefault("step", r.get("_step"))
    return RunState(source=f"wandb:{path}", status=state, rows=rows, final_loss=summary.get("val_loss") if state == "completed" else None,
                    final_bpb=summary.get("val_bpb") if state == "completed" else None, first_step_time=created)


# --------------------------------------------------------------------------- comparison


def compare(prereg: fmt.Prereg, run: RunState) -> dict[str, Any]:
    """Every eval point against the band, and the verdict (see module docstring)."""
    tol = prereg.tolerance_rel
    points = []
    for r in run.rows:
        if r.get("val_loss") is None or r.get("tokens") is None:
            continue
        actual = float(r["val_loss"])
        bands = prereg.bands_at(float(r["tokens"]))
        if bands is None or not math.isfinite(actual):
            continue  # before the first predicted point (warmup) or a non-finite loss (handled by status)
        points.append({
            "step": int(r["step"]),
            "tokens": float(r["tokens"]),
            "actual": actual,
            "predicted": bands["loss"],
            "lo90": bands["lo90"],
            "hi90": bands["hi90"],
            "rel_error": (actual - bands["loss"]) / bands["loss"],
            "in_50": bands["lo50"] <= actual <= bands["hi50"],
            "in_90": bands["lo90"] <= actual <= bands["hi90"],
        })
    final_pred = prereg.final
    result: dict[str, Any] = {
        "prereg": prereg.id,
        "seal": prereg.doc.get("seal", {}).get("digest"),
        "run": run.source,
        "status": run.status,
        "tolerance_rel": tol,
        "predicted_final_loss": final_pred["loss"],
        "n_points": len(points),
        "n_outside_90": sum(not p["in_90"] for p in points),
        "points": points,
    }
    if run.status in ("diverged", "failed"):
        result |= {"verdict": "failed", "why": f"run {run.status}" + (f": {run.reason}" if run.reason else "")}
    elif run.status == "completed":
        actual = run.final_loss if run.final_loss is not None else (points[-1]["actual"] if points else _last_val(run.rows))
        if actual is None:
            result |= {"verdict": "failed", "why": "run completed without a final val_loss"}
        else:
            rel = (actual - final_pred["loss"]) / final_pred["loss"]
            lo50, hi50 = final_pred.get("loss_50") or (None, None)
            lo90, hi90 = final_pred.get("loss_90") or (None, None)
            result |= {
                "verdict": "passed" if abs(rel) <= tol else "failed",
                "actual_final_loss": actual,
                "actual_final_bpb": run.final_bpb,
                "rel_error": rel,
                "covered_50": None if lo50 is None else bool(lo50 <= actual <= hi50),
                "covered_90": None if lo90 is None else bool(lo90 <= actual <= hi90),
                "why": f"final val_loss {actual:.4f} vs predicted {final_pred['loss']:.4f}: {rel:+.2%} (tolerance {tol:.2%})",
            }
    elif not points:
        result |= {"verdict": "not-started", "why": "no eval point inside the predicted trajectory yet"}
    else:
        last = points[-1]
        ok = last["in_90"] or abs(last["rel_error"]) <= tol
        result |= {
            "verdict": "on-track" if ok else "deviating",
            "rel_error": last["rel_error"],
            "latest_tokens": last["tokens"],
            "why": f"at {last['tokens']:.4g} tokens: {last['actual']:.4f} vs {last['predicted']:.4f} ({last['rel_error']:+.2%}), "
                   f"{'inside' if last['in_90'] else 'outside'} the 90% band [{last['lo90']:.4f}, {last['hi90']:.4f}]",
        }
    return result


def _last_val(rows: list[dict]) -> float | None:
    vals = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    return float(vals[-1]) if vals else None


def record_outcome(prereg_path: Path, result: dict) -> Path:
    """Write NAME.outcome.json beside the preregistration (outside the sealed file)."""
    out = fmt.outcome_path(prereg_path)
    keep = {k: v for k, v in result.items() if k != "points"}
    atomic_write_json(out, keep | {"checked": utc_now(), "points": result["points"]})
    return out


def check(prereg_path: Path, *, run_dir: Path | None = None, wandb_path: str | None = None) -> tuple[dict, fmt.Prereg, RunState]:
    prereg = fmt.load_prereg(prereg_path)
    seal = fmt.seal_status(prereg.doc)
    if not seal["ok"]:
        raise DelphiError(f"{prereg_path}: seal does not match its content (edited after sealing); run `delphi prereg verify`")
    run = read_run_dir(run_dir) if run_dir is not None else read_wandb(wandb_path)
    result = compare(prereg, run)
    result["seal_ok"] = seal["ok"]
    if result["verdict"] in ("passed", "failed"):
        result["outcome_file"] = str(record_outcome(prereg_path, result))
    return result, prereg, run


def watch(prereg_path: Path, *, run_dir: Path | None, wandb_path: str | None, interval_s: float, timeout_s: float | None, on_update=None) -> tuple[dict, fmt.Prereg, RunState]:
    """Poll until the run's status is terminal (or timeout_s passes)."""
    start = time.monotonic()
    last_n = -1
    while True:
        result, prereg, run = check(prereg_path, run_dir=run_dir, wandb_path=wandb_path)
        if on_update and result["n_points"] != last_n:
            on_update(result)
            last_n = result["n_points"]
        if run.status in TERMINAL:
            return result, prereg, run
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            result["watch"] = f"stopped after {timeout_s:g} s without a terminal status"
            return result, prereg, run
        time.sleep(interval_s)


def verify(prereg_path: Path, *, run_dir: Path | None = None, wandb_path: str | None = None) -> dict:
    """Recompute the seal; with a run, flag a preregistration created after its first logged step."""
    doc = fmt.read(prereg_path)
    seal = fmt.seal_status(doc)
    result = {"file": str(prereg_path), "id": doc.get("id"), "created": doc.get("created"), "seal_ok": seal["ok"],
              "seal_recorded": seal["recorded"], "seal_computed": seal["computed"], "problems": []}
    if not seal["ok"]:
        result["problems"].append("the seal does not match the content: the file was edited after it was sealed")
    if run_dir is not None or wandb_path is not None:
        run = read_run_dir(run_dir) if run_dir is not None else read_wandb(wandb_path)
        created = parse_utc(doc["created"])
        result["run"] = run.source
        result["run_first_step_time"] = run.first_step_time
        if run.first_step_time is None:
            result["created_before_start"] = True  # nothing logged yet: the prediction precedes the run
        else:
            result["created_before_start"] = created <= run.first_step_time
            if not result["created_before_start"]:
                result["problems"].append(f"created {doc['created']} after the run's first logged step "
                                          f"({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(run.first_step_time))})")
    result["ok"] = not result["problems"]
    return result
