"""muP learning-rate transfer check: `delphi mup lr-sweep` (docs/design.md §4.4).

    for each width w and base LR eta:  train a small muP model with the real trainer
                                       (delphi.train.trainer.train) -> final val loss
    per width: fit loss = a + b x + c x^2 with x = log2(eta) -> eta* = 2^(-b / 2c)
    movement:  max eta* / min eta* across widths (1 = perfect transfer), and the slope of
               log2(eta*) against log2(width) (0 under muP; about -1 under standard
               parameterisation with Adam, where the hidden LR must shrink like 1/width)

Every model shares the muP base shape (the first width, `n_layers` layers), so the base LR
means the same thing at every width: hidden matrices train at eta / m. Runs live in
OUT/runs/<run id>/ and a rerun skips the completed ones (resume).

The quadratic (`delphi.fits.lr_optimum.fit_quadratic`) is fitted to the best LR of a width and
up to two grid points on each side of it (a quadratic is only a local model of loss(log LR),
which rises steeply past the stability edge). The interval on eta* is the delta method on the fitted coefficients'
covariance (residual variance, so it needs more points than coefficients); it is a local
fit's interval, not a seed-to-seed one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delphi.data.loader import TokenStore
from delphi.data.store import resolve_store
from delphi.errors import DelphiError
from delphi.experiments.lrsweep_spec import LRSweepSpec, run_id
from delphi.fits.lr_optimum import QuadraticFit, fit_quadratic
from delphi.io import atomic_write_json, atomic_write_text
from delphi.plot import style as st
from delphi.plot.figures import lrsweep_figure
from delphi.train.rundir import CONFIG_FILE, SUMMARY_FILE, read_status
from delphi.train.trainer import config_yaml, train

# --------------------------------------------------------------------------- results


@dataclass
class LRSweepResult:
    spec: LRSweepSpec
    records: list[dict[str, Any]]  # one per run: width, lr, loss, status, run_id, wall_time_s
    fits: dict[int, QuadraticFit] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import numpy as np

        for w in self.spec.widths:
            rows = [r for r in self.records if r["width"] == w]
            self.fits[w] = fit_quadratic(np.array([r["lr"] for r in rows]), np.array([r["loss"] for r in rows], float))

    def optimum(self, width: int) -> float:
        """eta* of a width: the quadratic's optimum, else (no minimum) the best grid LR."""
        f = self.fits[width]
        return f.lr_opt if f.lr_opt is not None else f.best_lr

    @property
    def movement(self) -> dict[str, Any]:
        import numpy as np

        opt = np.array([self.optimum(w) for w in self.spec.widths])
        slope = float(np.polyfit(np.log2(self.spec.widths), np.log2(opt), 1)[0])
        return {
            "lr_opt_ratio_max_over_min": float(opt.max() / opt.min()),
            "lr_opt_octaves": float(np.log2(opt.max() / opt.min())),
            "lr_opt_slope_vs_width": slope,  # d log2(eta*) / d log2(width)
            "width_ratio": self.spec.widths[-1] / self.spec.widths[0],
            "all_interior": all(self.fits[w].interior for w in self.spec.widths),
        }

    def summary(self) -> str:
        s = self.spec
        lines = [
            f"LR sweep (muP, {s.ffn}, {s.n_layers} layers, base width {s.widths[0]}, {s.steps} steps of "
            f"{s.batch_size}x{s.seq_len} tokens): final val loss (nats/byte)"
        ]
        lines.append("  width " + "".join(f"{lr:>10.3g}" for lr in s.lrs) + "      eta* (90% interval)")
        for w in s.widths:
            by_lr = {r["lr"]: r["loss"] for r in self.records if r["width"] == w}
            f = self.fits[w]
            cells = "".join(f"{by_lr.get(lr, float('nan')):>10.4f}" for lr in s.lrs)
            if f.lr_opt is None:
                opt = f"no minimum: best grid LR {f.best_lr:.3g}"
            else:
                iv = f.lr_opt_interval_90
                opt = (
                    f"{f.lr_opt:.3g}"
                    + (f" ({iv[0]:.3g}-{iv[1]:.3g})" if iv else "")
                    + ("" if f.interior else " [extrapolated]")
                )
            lines.append(f"  {w:>5} {cells}      {opt}")
        m = self.movement
        lines.append(
            f"  => the optimum moved {m['lr_opt_ratio_max_over_min']:.2f}x (max/min) over a {m['width_ratio']:g}x "
            f"width range; slope d log eta*/d log width = {m['lr_opt_slope_vs_width']:+.2f} (0 = perfect transfer)"
        )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": dataclasses.asdict(self.spec),
            "runs": self.records,
            "fits": {str(w): f.to_json() for w, f in self.fits.items()},
            "lr_opt": {str(w): self.optimum(w) for w in self.spec.widths},
            "movement": self.movement,
        }


# --------------------------------------------------------------------------- running


def check_run_dirs(spec: LRSweepSpec, out_dir: Path) -> None:
    """Refuse (before training anything) a DIR whose existing runs were made with other settings."""
    if out_dir.exists() and not out_dir.is_dir():
        raise DelphiError(f"--out: {out_dir} exists and is not a directory")
    for w in spec.widths:
        for lr in spec.lrs:
            existing = out_dir / "runs" / run_id(w, lr) / CONFIG_FILE
            if existing.is_file() and existing.read_text() != config_yaml(spec.train_config(w, lr)):
                raise DelphiError(
                    f"--out: {existing.parent} holds a run with other settings (steps, shape or data); "
                    "use another directory"
                )


def run_sweep(spec: LRSweepSpec, out_dir: str | Path, *, log: bool = True) -> LRSweepResult:
    """Train every (width, LR) not already completed under OUT/runs/, then fit and return the result."""
    spec.validate()
    out_dir = Path(out_dir)
    try:
        store = resolve_store(spec.store)
    except DelphiError as e:
        raise DelphiError(f"--store: {e}") from None
    spec = dataclasses.replace(spec, store=str(store))
    check_run_dirs(spec, out_dir)
    TokenStore(store).check_run(spec.batch_size, spec.seq_len, spec.eval_tokens)

    records = []
    for w in spec.widths:
        for lr in spec.lrs:
            rid, run_dir = run_id(w, lr), out_dir / "runs" / run_id(w, lr)
            done = (read_status(run_dir) or {}).get("status") in ("completed", "diverged") and (
                run_dir / SUMMARY_FILE
            ).is_file()
            if done:
                summary = json.loads((run_dir / SUMMARY_FILE).read_text())
            else:
                summary = train(spec.train_config(w, lr), run_dir, resume=True, progress=False)
            loss = summary.get("val_loss")
            loss = float(loss) if summary.get("status") == "completed" and loss is not None else float("nan")
            records.append(
                {
                    "run_id": rid,
                    "width": w,
                    "lr": lr,
                    "loss": loss,
                    "status": summary.get("status"),
                    "steps": summary.get("steps"),
                    "params_nonembedding": summary.get("params_nonembedding"),
                    "wall_time_s": summary.get("wall_time_s"),
                    "skipped": done,
                }
            )
            if log:
                how = "done before" if done else f"{summary.get('wall_time_s', 0):.0f} s"
                print(f"  {rid:<16} val loss {loss:.4f}  ({summary.get('status')}, {how})", file=sys.stderr, flush=True)
    return LRSweepResult(spec=spec, records=records)


def save_report(result: LRSweepResult, out_dir: str | Path, written_by: str | None = None) -> dict[str, Any]:
    """sweep.csv, sweep.json and sweep.png/.svg (lrsweep_figure plus the fitted quadratics)."""
    import numpy as np
    import pandas as pd

    out_dir = Path(out_dir)
    table = pd.DataFrame(result.records)
    atomic_write_text(out_dir / "sweep.csv", table.to_csv(index=False), written_by=written_by)
    fig = lrsweep_figure(table[np.isfinite(table["loss"])])
    ax = fig.axes[0]
    for color, w in zip(st.budget_colors(len(result.spec.widths)), sorted(result.spec.widths)):
        f = result.fits[w]
        if f.coef is None:
            continue
        x = np.linspace(math.log2(min(f.lrs)), math.log2(max(f.lrs)), 60)
        a, b, c = f.coef
        ax.plot(2.0**x, a + b * x + c * x * x, "--", lw=0.9, color=color)
        if f.lr_opt is not None and f.interior:
            ax.axvline(f.lr_opt, color=color, lw=0.6, alpha=0.6)
    m = result.movement
    ax.set_title(
        f"muP LR sweep: optimum moved {m['lr_opt_ratio_max_over_min']:.2f}x over {m['width_ratio']:g}x width "
        "(dashed: quadratic fits)",
        fontsize=9,
    )
    files = st.save_figure(fig, out_dir / "sweep.png", written_by=written_by)
    report = {
        **result.to_json(),
        "csv": str(out_dir / "sweep.csv"),
        "json": str(out_dir / "sweep.json"),
        "plots": files,
    }
    atomic_write_json(out_dir / "sweep.json", report, written_by=written_by)
    return report
