"""Is the ladder's LR transfer rule near the optimum at the shapes and horizons it trains?
`delphi ladder lr-calibrate`.

A scaling law fitted to a ladder predicts the hero's loss under the ladder's recipe. When the
recipe's learning rate drifts away from the optimum with width or token horizon, the ladder's
large or long rungs lose loss to the LR, and the law carries that loss into the extrapolation
(docs/notebook.md). This experiment measures
the drift at the ladder's own shapes, batch and schedule:

    for each point (d_model, tokens) and multiplier m:  train the rung `make_rung` plans there,
                                                        at lr = m x the rule's lr -> final val loss
    per point:   quadratic in log2(m) around the best m -> m* (the optimum, in units of the rule)
    over points: log m* = c + a log(d / d0) + b log(T / T0)  (least squares)
                 -> the corrected rule: base.lr x e^c, width_exponent - a, horizon_exponent - b

Rungs train at the top budget's batch (the batch the hero continues) unless `--batch` says
otherwise; the fit above uses the top batch's points only, and a point at another batch checks
the rule's batch term. The rungs form a ladder directory (configs/, manifest.csv, runs/), so
they get the ladder runner's workers, progress and resume, and a second call extends them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from delphi.errors import DelphiError, quoted
from delphi.fits.lr_optimum import fit_lr_drift, fit_quadratic
from delphi.io import atomic_write_text, atomic_write_yaml, read_json
from delphi.ladder.manifest import (
    CONFIG_DIR,
    MANIFEST_FILE,
    RUNS_DIR,
    SPEC_FILE,
    manifest_csv,
    manifest_row,
    read_manifest,
    write_ladder,
)
from delphi.ladder.plan import Rung, make_rung, plan_ladder, shape_for_width, transfer
from delphi.ladder.spec import LadderSpec, load_ladder_spec
from delphi.model.flops import flops_per_token
from delphi.train.config import train_config_to_dict

DEFAULT_MULTIPLIERS = (0.125, 0.25, 0.5, 1.0, 2.0)
# The quadratic in log2 LR goes through the best multiplier and one on each side: past the optimum
# the loss climbs a cliff, not a parabola (the calibration sweeps: docs/notebook.md), and a wider fit
# drags the vertex off the grid.
FIT_NEIGHBOURS = 1
REPORT_FILE = "lr_calibration.json"


@dataclass(frozen=True)
class Point:
    d_model: int
    tokens: float  # token horizon of the run

    @classmethod
    def parse(cls, text: str) -> "Point":
        """'48@8.4e6': d_model 48 trained on 8.4M tokens."""
        try:
            d, t = text.split("@")
            point = cls(int(d), float(t))
        except ValueError:
            raise DelphiError(f"--points: expected D_MODEL@TOKENS (e.g. 48@8.4e6), got {quoted(text)}") from None
        if point.d_model <= 0 or not (point.tokens > 0 and math.isfinite(point.tokens)):
            raise DelphiError(f"--points: d_model and tokens must be positive, got {quoted(text)}")
        return point


def run_id_for(model_d: int, n_layers: int, tokens: float, multiplier: float, batch: int | None = None) -> str:
    """`batch` (sequences per step) only when it is not the top budget's."""
    b = f"_b{batch}" if batch is not None else ""
    return f"LR_T{tokens:.3g}_d{model_d}_L{n_layers}{b}_x{multiplier:g}_s0"


def top_batch_seqs(spec: LadderSpec) -> int:
    """Sequences per step of the top budget's rungs: the batch the hero continues."""
    top = max(spec.budgets)
    return max(r.batch_size for r in plan_ladder(spec) if r.budget == top)


def plan_calibration(
    spec: LadderSpec,
    points: list[Point],
    multipliers: tuple[float, ...] = DEFAULT_MULTIPLIERS,
    batch: int | None = None,
) -> list[Rung]:
    """One rung per (point, multiplier): the ladder's own rung at that shape and horizon, LR scaled.
    Every rung trains `batch` sequences per step (None: the top budget's, which the hero continues)."""
    if spec.recipe is not None:  # its rule is the recipe's, not transfer's: rule_drift would judge another rule
        raise DelphiError("recipe: this ladder spec has a recipe; measure it with `delphi ladder recipe-check`")
    if not multipliers or len(set(multipliers)) != len(multipliers) or min(multipliers) <= 0:
        raise DelphiError(f"--multipliers: need distinct positive values, got {list(multipliers)}")
    if not points or len(set(points)) != len(points):
        raise DelphiError(f"--points: need at least one point and no duplicates, got {points}")
    top_batch = top_batch_seqs(spec)
    if batch is not None and batch < 1:
        raise DelphiError(f"--batch: sequences per step must be >= 1, got {batch}")
    rungs = []
    for p in points:
        model = shape_for_width(spec, p.d_model)
        base_rung = make_rung(spec, model, p.tokens * flops_per_token(model, spec.seq_len), 0, batch=batch or top_batch)
        if base_rung is None or base_rung.steps < spec.batch.min_steps:  # runs the ladder itself would not train
            raise DelphiError(
                f"--points: {p.d_model}@{p.tokens:g} trains {base_rung.steps if base_rung else 0:,} steps of "
                f"{batch or top_batch} sequences, fewer than batch.min_steps={spec.batch.min_steps:,}"
            )
        for m in multipliers:
            hp = dataclasses.replace(base_rung.hp, lr=base_rung.hp.lr * m)
            run_id = run_id_for(p.d_model, model.n_layers, p.tokens, m, None if batch in (None, top_batch) else batch)
            train = dataclasses.replace(
                base_rung.train, optim=dataclasses.replace(base_rung.train.optim, lr=hp.lr), name=run_id
            )
            rungs.append(dataclasses.replace(base_rung, run_id=run_id, hp=hp, train=train))
    return rungs


def write_calibration(
    spec: LadderSpec, points: list[Point], multipliers: tuple[float, ...], out: str | Path, batch: int | None = None
) -> list[Rung]:
    """Plan the rungs into `out` (a ladder directory). A directory that already holds a calibration
    of the same spec is extended: its rungs and runs stay, new (point, multiplier) rungs join them,
    so an optimum found at the edge of the multipliers is bracketed by a second call."""
    rungs = plan_calibration(spec, points, multipliers, batch)
    out = Path(out)
    if not (out / MANIFEST_FILE).is_file():
        write_ladder(spec, rungs, out)
        return rungs
    if load_ladder_spec(out / SPEC_FILE) != spec:
        raise DelphiError(
            f"--out: {out} holds a calibration of another ladder spec ({SPEC_FILE} differs); choose a new directory"
        )
    rows = {row["run_id"]: row for row in read_manifest(out)}
    for rung in rungs:
        if rung.run_id not in rows:
            atomic_write_yaml(out / CONFIG_DIR / f"{rung.run_id}.yaml", train_config_to_dict(rung.train))
            rows[rung.run_id] = manifest_row(rung)
    atomic_write_text(out / MANIFEST_FILE, manifest_csv(list(rows.values())))
    return rungs


# ---- analysis ----------------------------------------------------------------------------------


@dataclass
class PointOptimum:
    d_model: int
    tokens: float  # the runs' actual tokens (steps x batch)
    batch_tokens: int
    lr_rule: float  # the calibrated rule's LR here (multiplier 1)
    multipliers: list[float]
    losses: list[float]  # NaN where the run diverged or is missing
    best_multiplier: float | None  # the grid point with the lowest loss
    m_opt: float | None  # the quadratic's optimum in units of the rule's lr
    m_opt_interval_90: tuple[float, float] | None
    interior: bool  # the optimum lies inside the fitted multipliers
    loss_at_rule: float | None
    loss_at_opt: float | None  # the quadratic's minimum
    curvature: float | None  # the quadratic's c: loss rises c x (log2 LR/LR*)^2 nats off the optimum

    @property
    def lr_opt(self) -> float | None:
        return self.lr_rule * self.m_opt if self.m_opt is not None else None

    @property
    def loss_lost_frac(self) -> float | None:
        """How much higher the rule's loss is than the optimum's (the error the rule adds to a rung)."""
        if self.loss_at_rule is None or self.loss_at_opt is None:
            return None
        return self.loss_at_rule / self.loss_at_opt - 1


@dataclass
class CalibrationResult:
    base_d_model: int
    base_tokens: float
    points: list[PointOptimum]
    # log m* = c + a log(d/d0) + b log(T/T0); None where the points cannot identify a term
    coef: dict[str, float | None]
    rule_now: dict[str, float]
    rule_suggested: dict[str, float] | None

    def summary(self) -> str:
        lines = [
            "LR calibration: optimum LR in units of the transfer rule's (m* = 1: the rule is right)",
            f"{'d_model':>7} {'tokens':>9} {'batch':>6} {'lr rule':>9} {'m*':>6} {'90% interval':>15} {'loss@rule':>9} "
            f"{'loss@m*':>8} {'lost':>6}",
        ]
        for p in self.points:
            iv = f"[{p.m_opt_interval_90[0]:.2f}, {p.m_opt_interval_90[1]:.2f}]" if p.m_opt_interval_90 else "-"
            m = f"{p.m_opt:.2f}" if p.interior else _edge(p)
            lost = f"{p.loss_lost_frac:+.1%}" if p.loss_lost_frac is not None else "-"
            lines.append(
                f"{p.d_model:>7} {p.tokens:>9.3g} {p.batch_tokens:>6} {p.lr_rule:>9.4g} {m:>6} {iv:>15} "
                f"{_f(p.loss_at_rule):>9} {_f(p.loss_at_opt):>8} {lost:>6}"
            )
        if not all(p.interior for p in self.points):
            lines.append(
                "(<x, >x: the optimum lies past the multipliers tried; extend them with a second call into the same --out)"
            )
        coef = ", ".join(f"{k} = {v:+.3f}" if v is not None else f"{k} = n/a" for k, v in self.coef.items())
        lines.append(f"log m* = c + a log(d/{self.base_d_model}) + b log(T/{self.base_tokens:.3g}):  {coef}")
        now = self.rule_now
        lines.append(
            f"rule now:       lr = {now['lr']:.4g}, width_exponent {now['width_exponent']:.3f}, "
            f"horizon_exponent {now['horizon_exponent']:.3f}"
        )
        if self.rule_suggested:
            s = self.rule_suggested
            lines.append(
                f"rule suggested: lr = {s['lr']:.4g}, width_exponent {s['width_exponent']:.3f}, "
                f"horizon_exponent {s['horizon_exponent']:.3f}"
            )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for row, p in zip(out["points"], self.points):
            row["loss_lost_frac"] = p.loss_lost_frac
            row["lr_opt"] = p.lr_opt
        return out


def _edge(p: PointOptimum) -> str:
    if p.best_multiplier is None:
        return "-"
    if p.best_multiplier == min(p.multipliers):
        return f"<{p.best_multiplier:g}"
    if p.best_multiplier == max(p.multipliers):
        return f">{p.best_multiplier:g}"
    return "?"  # inside the grid but no minimum fitted (too few finite runs around it)


def _f(x: float | None) -> str:
    return f"{x:.4f}" if x is not None else "-"


def completed_val_loss(run_dir: Path) -> float:
    """A run's final val_loss if it completed, else NaN (lr-calibrate and recipe-check score runs so)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return math.nan
    loss = summary.get("val_loss")
    return float(loss) if summary.get("status") == "completed" and loss is not None else math.nan


def analyse(spec: LadderSpec, ladder_dir: str | Path) -> CalibrationResult:
    """Every point of the calibration in `ladder_dir` (its manifest), against `spec`'s rule."""

    ladder_dir = Path(ladder_dir)
    groups: dict[tuple[int, int, int], list[dict[str, str]]] = {}
    for row in read_manifest(ladder_dir):
        groups.setdefault((int(row["d_model"]), int(row["tokens"]), int(row["batch_tokens"])), []).append(row)
    points = []
    for (d, tokens, _), rows in sorted(groups.items()):
        rows = sorted(rows, key=lambda row: _multiplier(row["run_id"]))
        mults = [_multiplier(row["run_id"]) for row in rows]
        lr_rule = float(rows[0]["lr"]) / mults[0]
        losses = [completed_val_loss(ladder_dir / RUNS_DIR / row["run_id"]) for row in rows]
        finite = [(m, loss) for m, loss in zip(mults, losses) if math.isfinite(loss)]
        fit = (
            fit_quadratic(np.array([m for m, _ in finite]), np.array([loss for _, loss in finite]), FIT_NEIGHBOURS)
            if len(finite) >= 3
            else None
        )
        at_rule = dict(zip(mults, losses)).get(1.0)
        points.append(
            PointOptimum(
                d_model=d,
                tokens=float(tokens),
                batch_tokens=int(rows[0]["batch_tokens"]),
                lr_rule=lr_rule,
                multipliers=mults,
                losses=losses,
                best_multiplier=min(finite, key=lambda ml: ml[1])[0] if finite else None,
                m_opt=fit.lr_opt if fit else None,
                m_opt_interval_90=fit.lr_opt_interval_90 if fit else None,
                interior=bool(fit and fit.interior),
                loss_at_rule=at_rule if at_rule is not None and math.isfinite(at_rule) else None,
                loss_at_opt=fit.loss_opt if fit else None,
                curvature=fit.coef[2] if fit and fit.coef else None,
            )
        )
    t = spec.transfer
    # The rule's width and horizon terms are refitted at the top budget's batch only; a point at
    # another batch checks the batch term (gate lr_transfer) without moving the others.
    top_tokens = top_batch_seqs(spec) * spec.seq_len
    coef = _fit_drift([p for p in points if p.batch_tokens == top_tokens], spec.base.d_model, spec.base.tokens)
    now = {"lr": spec.base.lr, "width_exponent": t.width_exponent, "horizon_exponent": t.horizon_exponent}
    suggested = None
    if coef["c"] is not None:
        suggested = {
            "lr": spec.base.lr * math.exp(coef["c"]),
            "width_exponent": t.width_exponent - (coef["a"] or 0.0),
            "horizon_exponent": t.horizon_exponent - (coef["b"] or 0.0),
        }
    return CalibrationResult(spec.base.d_model, spec.base.tokens, points, coef, now, suggested)


def _multiplier(run_id: str) -> float:
    return float(run_id.rsplit("_x", 1)[1].split("_s", 1)[0])


def _fit_drift(points: list[PointOptimum], d0: int, t0: float) -> dict[str, float | None]:
    """log m* = c + a log(d / d0) + b log(T / t0) over the interior optima (`fit_lr_drift`)."""

    ok = [p for p in points if p.m_opt is not None and p.interior]
    fitted = (
        fit_lr_drift([p.m_opt for p in ok], [p.d_model / d0 for p in ok], [p.tokens / t0 for p in ok]) if ok else None
    )
    c, a, b = fitted if fitted is not None else (None, None, None)
    return {"c": c, "a": a, "b": b}


def save_report(result: CalibrationResult, out: str | Path) -> Path:
    path = Path(out) / REPORT_FILE
    atomic_write_text(path, json.dumps(result.to_json(), indent=2) + "\n")
    return path


# ---- the gate's view: the spec's rule today against the optima measured --------------------------


def merge_reports(paths: list[Path]) -> dict[str, Any]:
    """The points of several `lr-calibrate` reports as one (e.g. a family's narrow points measured
    under one spec and its widest under another: each point's optimum LR is absolute)."""

    points, sources = [], []
    for path in paths:
        report = read_json(path, what="LR calibration JSON")
        if not isinstance(report, dict) or not isinstance(report.get("points"), list):
            raise DelphiError(f"{path}: not an lr-calibrate report (expected a 'points' list)")
        points += report["points"]
        sources.append(str(path))
    return {"sources": sources, "points": points}


def rule_drift(calibration: dict, spec: LadderSpec) -> list[dict[str, Any]]:
    """Each calibrated point under `spec`'s transfer rule (which may have been corrected since the
    calibration ran): m_now = LR* / the rule's LR now, and the loss that costs, c (log2 m_now)^2,
    as a share of the optimum's loss. Points without an interior optimum have m_now None."""

    rows = []
    for p in calibration["points"]:
        lr_now = transfer(spec, int(p["d_model"]), int(p["batch_tokens"]), float(p["tokens"])).lr
        row = {
            "d_model": int(p["d_model"]),
            "tokens": float(p["tokens"]),
            "lr_now": lr_now,
            "lr_opt": p.get("lr_opt"),
            "m_now": None,
            "lost_frac_now": None,
        }
        if p.get("lr_opt") and p.get("interior") and p.get("curvature") and p.get("loss_at_opt"):
            m_now = float(p["lr_opt"]) / lr_now
            row["m_now"] = m_now
            row["lost_frac_now"] = float(p["curvature"]) * math.log2(m_now) ** 2 / float(p["loss_at_opt"])
        rows.append(row)
    return rows
