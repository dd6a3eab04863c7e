"""The recipe check's report: its JSON and the runs' table written into the check's directory, and
the text `delphi ladder recipe-check` prints."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from delphi.io import atomic_write_text, read_json
from delphi.ladder.lr_calibration import completed_val_loss
from delphi.ladder.manifest import RUNS_DIR, read_manifest
from delphi.ladder.recipe_check import PLAN_FILE, REPORT_FILE

RUNS_CSV = "recipe_check_runs.csv"


RUNS_CSV_COLUMNS = (
    "run_id",
    "kind",
    "point",
    "d_model",
    "n_layers",
    "tokens",
    "steps",
    "batch_size",
    "lr_multiplier",
    "batch_multiplier",
    "seed",
    "optimizer",
    "lr",
    "adam_lr",
    "beta2",
    "eps",
    "val_loss",
    "source",
)


def runs_csv(out: str | Path) -> str:
    """One row per (run, role) of the check in `out`: what it trained with and its final loss (the
    compact record a check commits; `analyse` recomputes the report from it and the plan)."""
    out = Path(out)
    plan = read_json(out / PLAN_FILE, what="recipe-check plan")
    manifests: dict[str, dict[str, dict[str, str]]] = {}
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=RUNS_CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in plan["check_runs"]:
        source = r.get("source", "")
        home = Path(source) if source else out
        if source not in manifests:
            manifests[source] = {row["run_id"]: row for row in read_manifest(home)}
        m = manifests[source][r["run_id"]]
        loss = completed_val_loss(home / RUNS_DIR / r["run_id"])
        writer.writerow(
            {
                **{
                    k: r[k]
                    for k in (
                        "run_id",
                        "kind",
                        "point",
                        "d_model",
                        "tokens",
                        "lr_multiplier",
                        "batch_multiplier",
                        "seed",
                    )
                },
                **{
                    k: m.get(k, "")
                    for k in ("n_layers", "steps", "batch_size", "optimizer", "lr", "adam_lr", "beta2", "eps")
                },
                "val_loss": repr(loss) if math.isfinite(loss) else "",
                "source": source,
            }
        )
    return buf.getvalue()


def save_report(report: dict[str, Any], out: str | Path) -> Path:
    """Write the report (JSON) and the runs' table (CSV) into `out`; the JSON's path."""
    path = Path(out) / REPORT_FILE
    atomic_write_text(path, json.dumps(report, indent=2) + "\n")
    atomic_write_text(Path(out) / RUNS_CSV, runs_csv(out))
    return path


def _pct(x: float | None) -> str:
    return f"{x:+.2%}" if x is not None else "-"


def format_report(report: dict[str, Any]) -> str:
    def loss(x: float | None) -> str:
        return f"{x:.4f}" if x is not None else "-"

    lines = [
        f"recipe check of {report['spec']} ({report['optimizer']}): loss lost to the recipe's LR / batch, "
        f"the fitted curve at the recipe's value over its minimum (limit {report['max_lost_frac']:.1%}); "
        f"observed: the recipe's seed mean over the best, seed noise included",
        f"{'kind':<8} {'point':<14} {'swept':<6} {'optimum':>8} {'mean@1':>7} {'curve@1':>7} {'curve min':>9} "
        f"{'lost':>7} {'observed':>8} {'seed sd':>7} {'runs':>5}",
    ]
    for p in report["points"]:
        if p["x_opt"] is not None and p["interior"]:
            opt = f"{p['x_opt']:.2f}x"
        else:  # no interior optimum: the best point tried (at the grid's edge, the loss lost is a lower bound)
            opt = f"best {p['best_x']:g}x" if p["best_x"] is not None else "-"
        sd = f"{p['seed_sd']:.4f}" if p["seed_sd"] is not None else "-"
        prior = f" ({p['prior_runs']} prior)" if p.get("prior_runs") else ""
        lines.append(
            f"{p['kind']:<8} {p['point']:<14} {p['swept']:<6} {opt:>8} {loss(p['loss_at_recipe']):>7} "
            f"{loss(p.get('loss_at_recipe_fit')):>7} {loss(p.get('loss_opt_fit') or p['loss_opt']):>9} "
            f"{_pct(p['lost_frac']):>7} {_pct(p.get('lost_observed_frac')):>8} {sd:>7} "
            f"{p['completed']:>2}/{p['runs']:<2}{prior}"
        )
    t, h = report["trend"], report["hero"]
    lines.append(
        f"trend carried to the hero {h['run_id']} (d{h['d_model']}, {h['tokens']:.3g} tokens): width "
        f"{_pct(t['width_at_hero'])}, horizon {_pct(t['horizon_at_hero'])}"
    )
    d = report["drift"]
    if d["a"] is not None:
        lines.append(
            f"LR optimum drift: log m* = {d['a']:+.3f}"
            + (f" {d['b']:+.3f} log(d/d_ref)" if d["b"] is not None else "")
            + (f" {d['c']:+.3f} log(T/T0)" if d["c"] is not None else "")
        )
    if report.get("recipe_suggested"):
        s = report["recipe_suggested"]
        now = report["recipe_now"]
        lines.append(
            f"recipe now: lr {now['lr']:.4g}, horizon_exponent {now['horizon_exponent']:.3f}, width_exponent "
            f"{now.get('width_exponent', 0.0):.3f}; fitted: lr {s['lr']:.4g}, horizon_exponent "
            f"{s['horizon_exponent']:.3f}, width_exponent {s.get('width_exponent', 0.0):.3f}"
        )
    for prior in report.get("priors") or []:
        lines.append(f"reused from --prior {prior['dir']}: {prior['runs']} runs, {prior['flops']:.3g} FLOPs")
    cm = report["compute"]
    lines.append(
        f"compute: check {cm['check_flops']:.3g} FLOPs = {cm['compute_ratio']:.1%} of the study's {cm['study_flops']:.3g} "
        f"(limit {cm['max_compute_ratio']:.0%})"
    )
    return "\n".join(lines)
