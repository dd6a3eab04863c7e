"""Whole-curve loss model: the LR-annealing law with a model-size term.

Tissue et al. 2024 ("Scaling Law with Learning Rate Annealing", arXiv:2408.11029)
found that a validation-loss curve follows

    L(s) = L0 + A * S1(s)^-alpha - C * S2(s)

where S1 is the forward area (the sum of the LRs of the updates done so far)
and S2 the annealing area: S2(s) = sum_{i<=s} m_i with the momentum
m_i = lambda * m_{i-1} + (eta_{i-1} - eta_i), lambda ~ 0.999. Warmup updates are
counted at the peak LR (their section 3.4): warmup is a numerical device, not
"less training".

Delphi fits one law across all the ladder's curves at once:

    L(N, s) = E + A * N^-alpha + B * S1(s)^-beta - C * S2(s)

Choices, and why:
- S1 is measured in *LR-weighted tokens*: S1 = sum_i r_i * tokens_per_step with
  r_i = eta_i / eta_ref (eta_ref the largest peak LR among the fitted runs). For
  a constant LR, S1 = D and the law's first three terms are exactly Chinchilla's
  E + A/N^alpha + B/D^beta, so the curve's end can be compared term by term with
  the parametric scaling law. Tokens rather than steps, because ladder rungs use
  different batch sizes (docs/design.md §8.1: batch scales with the rung).
- S2 stays in steps of normalised LR, as in the paper: the momentum lambda acts
  per optimizer update.
- The model-size dependence is an additive Chinchilla term A * N^-alpha, with
  B, beta and C shared across sizes. It is the smallest extension that makes
  L0 = E + A N^-alpha depend on N (the paper's own model-size extension has the
  same additive form). With one model size the law falls back to the paper's
  4-parameter form (L0, B, beta, C).
- Fitting is variable projection, as for VPNLS (docs/design.md §6.1): for fixed
  exponents the law is linear in (E, A, B, C) >= 0, so a grid over (alpha, beta)
  with non-negative least squares gives the start, then scipy's least_squares
  refines all six parameters.
- Uncertainty: bootstrap clustered by run (whole curves are resampled, because
  the points of one curve share its seed noise), plus the residual noise of a
  single eval, so a band is a band for an *observed* eval loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Float
from scipy.optimize import least_squares, nnls
from scipy.signal import lfilter

from delphi.errors import DelphiError, quoted
from delphi.fits.diagnostics import FitDiagnostics
from delphi.fits.evals import eval_points, eval_steps
from delphi.fits.results import FitStatus, fit_status
from delphi.model.flops import count_params
from delphi.train.config import load_train_config
from delphi.train.rundir import CONFIG_FILE, METRICS_FILE, STATUS_FILE, read_metrics, read_status
from delphi.train.schedules import lr_factor_schedule, warmup_steps

# Tissue et al. 2024, section 3: the decay factor of the annealing momentum;
# they report 0.999 working across their runs (0.99-0.999 range studied).
TISSUE_MOMENTUM_DECAY = 0.999
# Quantiles of the reported bands: 50% and 90% central intervals.
BAND_QUANTILES = {"lo90": 0.05, "lo50": 0.25, "hi50": 0.75, "hi90": 0.95}
# Eval points taken before this fraction of a run's updates are dropped from
# fits: the first few percent of training are the "early plateau" regime that
# no power law in S1 describes (docs/design.md §8.1, pilot notes).
DEFAULT_MIN_PROGRESS = 0.05
# Grid of exponent starts for the variable-projection search.
ALPHA_GRID = (0.1, 0.2, 0.3, 0.4, 0.6, 0.8)
BETA_GRID = (0.1, 0.2, 0.3, 0.4, 0.6, 0.8)

PARAM_NAMES = ("E", "A", "alpha", "B", "beta", "C")
# Search region of the least-squares refinement: exponents, and the log of the amplitudes A, B
# (E and C are bounded below by 0). A parameter on one of these bounds sets status "at_bound".
EXPONENT_BOUNDS = (0.01, 3.0)
LOG_AMPLITUDE_BOUNDS = (-50.0, 50.0)
BOUND_TOLERANCE = 1e-6  # closer than this (in the searched coordinate) to a bound is on it
INTERVAL_QUANTILES = (0.05, 0.95)  # the 90% parameter intervals


# --------------------------------------------------------------------------- schedules


def lr_factors(optim: Any, steps: int) -> Float[np.ndarray, " steps"]:
    """LR multiple of the peak for every update 0..steps-1: the trainer's own schedule, on the host."""
    return lr_factor_schedule(optim, steps, xp=np)(np.arange(steps))


def annealing_areas(
    lr: Float[np.ndarray, " steps"],
    tokens_per_step: float,
    *,
    warmup_updates: int = 0,
    momentum_decay: float = TISSUE_MOMENTUM_DECAY,
) -> tuple[Float[np.ndarray, " steps1"], Float[np.ndarray, " steps1"]]:
    """S1 (LR-weighted tokens) and S2 (annealing area) after 0..steps updates.

    `lr` is the per-update LR in units of the reference LR. Index k of the
    results is the state after k updates (index 0: nothing trained).
    """
    eta = np.array(lr, dtype=np.float64)
    if warmup_updates > 0 and eta.size:
        # Tissue et al. section 3.4: count warmup at the peak LR.
        eta[:warmup_updates] = eta[min(warmup_updates, eta.size - 1)]
    s1 = np.concatenate([[0.0], np.cumsum(eta) * tokens_per_step])
    drop = np.concatenate([[0.0], eta[:-1] - eta[1:]]) if eta.size else np.zeros(0)
    momentum = lfilter([1.0], [1.0, -momentum_decay], drop)
    s2 = np.concatenate([[0.0], np.cumsum(momentum)])
    return s1, s2


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Curve:
    """One run's eval curve with the quantities the law needs at each point."""

    run_id: str
    params: float  # N: active non-embedding parameters
    tokens: Float[np.ndarray, " points"]
    loss: Float[np.ndarray, " points"]
    s1: Float[np.ndarray, " points"]
    s2: Float[np.ndarray, " points"]
    total_tokens: float


def curve_from_schedule(
    run_id: str,
    params: float,
    lr: Sequence[float],
    tokens_per_step: float,
    eval_tokens: Sequence[float],
    eval_loss: Sequence[float],
    *,
    warmup_updates: int = 0,
    momentum_decay: float = TISSUE_MOMENTUM_DECAY,
) -> Curve:
    """Build a Curve from a per-update LR sequence (in reference-LR units) and eval points."""
    lr = np.asarray(lr, dtype=np.float64)
    s1_all, s2_all = annealing_areas(lr, tokens_per_step, warmup_updates=warmup_updates, momentum_decay=momentum_decay)
    tokens = np.asarray(eval_tokens, dtype=np.float64)
    updates = np.clip(np.rint(tokens / tokens_per_step).astype(int), 0, lr.size)
    return Curve(
        run_id=run_id,
        params=float(params),
        tokens=tokens,
        loss=np.asarray(eval_loss, dtype=np.float64),
        s1=s1_all[updates],
        s2=s2_all[updates],
        total_tokens=float(lr.size * tokens_per_step),
    )


def load_run_curve(
    run_dir: str | Path, *, lr_ref: float | None = None, momentum_decay: float = TISSUE_MOMENTUM_DECAY
) -> Curve:
    """A run dir's eval curve, with S1/S2 rebuilt from its resolved config's schedule."""

    run_dir = Path(run_dir)
    cfg = load_train_config(run_dir / CONFIG_FILE)
    _, tokens, loss = eval_points(read_metrics(run_dir))
    peak = cfg.optim.lr / (lr_ref or cfg.optim.lr)
    return curve_from_schedule(
        run_dir.name,
        count_params(cfg.model).nonembedding,
        peak * lr_factors(cfg.optim, cfg.steps),
        cfg.tokens_per_step,
        tokens,
        loss,
        warmup_updates=warmup_steps(cfg.optim, cfg.steps),
        momentum_decay=momentum_decay,
    )


def find_run_dirs(root: str | Path) -> list[Path]:
    """Run dirs (config.yaml + metrics.jsonl) at most three levels under `root`."""
    root = Path(root)
    found = []
    for pattern in (METRICS_FILE, f"*/{METRICS_FILE}", f"*/*/{METRICS_FILE}", f"*/*/*/{METRICS_FILE}"):
        found += [p.parent for p in root.glob(pattern) if (p.parent / CONFIG_FILE).is_file()]
    return sorted(set(found))


def ladder_lr_ref(ladder_dir: str | Path) -> float:
    """The reference LR of a ladder's curves: the largest peak LR among its runs."""
    return max(load_train_config(r / CONFIG_FILE).optim.lr for r in find_run_dirs(ladder_dir))


def load_ladder_curves(ladder_dir: str | Path, *, momentum_decay: float = TISSUE_MOMENTUM_DECAY) -> list[Curve]:
    """Every completed run's curve under a ladder dir, all in units of `ladder_lr_ref`."""

    runs = []
    for run in find_run_dirs(ladder_dir):
        status = (read_status(run) or {}).get("status", "completed")
        if status in ("completed", "running") or not (run / STATUS_FILE).exists():
            runs.append(run)
    if not runs:
        raise DelphiError(f"{ladder_dir}: no run dirs with config.yaml and metrics.jsonl found")
    lr_ref = ladder_lr_ref(ladder_dir)
    curves = [load_run_curve(r, lr_ref=lr_ref, momentum_decay=momentum_decay) for r in runs]
    return [c for c in curves if c.loss.size]


# --------------------------------------------------------------------------- the law


def law(theta: Sequence[float], params, s1, s2) -> np.ndarray:
    """L = E + A N^-alpha + B S1^-beta - C S2 (see module docstring)."""
    E, A, alpha, B, beta, C = theta
    return E + A * np.power(params, -alpha) + B * np.power(np.maximum(s1, 1.0), -beta) - C * s2


@dataclass
class _Stacked:
    params: np.ndarray
    s1: np.ndarray
    s2: np.ndarray
    loss: np.ndarray
    run: np.ndarray  # index of the curve each point came from


def _stack(curves: Sequence[Curve], min_progress: float) -> _Stacked:
    parts = []
    for k, c in enumerate(curves):
        keep = (c.tokens >= min_progress * c.total_tokens) & (c.s1 > 0)
        n = int(keep.sum())
        parts.append((np.full(n, c.params), c.s1[keep], c.s2[keep], c.loss[keep], np.full(n, k)))
    if not parts or sum(p[0].size for p in parts) == 0:
        raise DelphiError("curve fit: no eval points to fit (every curve empty or still in warmup)")
    return _Stacked(*(np.concatenate(x) for x in zip(*parts)))


def _fit_once(d: _Stacked, single_size: bool, start: np.ndarray | None = None) -> np.ndarray:
    """Variable projection start + least-squares refinement; returns theta.

    With `start` (a bootstrap replicate starting from the full fit), only the
    exponents of `start` are tried in the variable-projection step.
    """
    best, best_sse = None, np.inf
    alphas = (0.3,) if single_size else ALPHA_GRID
    betas = BETA_GRID
    if start is not None:
        alphas, betas = (float(start[2]),), (float(start[4]),)
    for alpha in alphas:
        for beta in betas:
            cols = [np.ones_like(d.loss), np.power(d.params, -alpha), np.power(d.s1, -beta), -d.s2]
            if single_size:
                cols[1] = np.zeros_like(d.loss)
            X = np.stack(cols, axis=1)
            scale = np.maximum(np.abs(X).max(axis=0), 1e-300)
            coef, _ = nnls(X / scale, d.loss)
            coef = coef / scale
            sse = float(np.sum((X @ coef - d.loss) ** 2))
            if sse < best_sse:
                best_sse, best = sse, (coef[0], coef[1], alpha, coef[2], beta, coef[3])
    E, A, alpha, B, beta, C = best

    # Refine in a well-scaled space: log of the positive amplitudes.
    def unpack(x):
        if single_size:
            return (x[0], 0.0, alpha, math.exp(x[1]), x[2], x[3])
        return (x[0], math.exp(x[1]), x[2], math.exp(x[3]), x[4], x[5])

    tiny = 1e-12
    (log_lo, log_hi), (exp_lo, exp_hi) = LOG_AMPLITUDE_BOUNDS, EXPONENT_BOUNDS
    if single_size:
        x0 = [E, math.log(max(B, tiny)), beta, C]
        lo, hi = [0.0, log_lo, exp_lo, 0.0], [np.inf, log_hi, exp_hi, np.inf]
    else:
        x0 = [E, math.log(max(A, tiny)), alpha, math.log(max(B, tiny)), beta, C]
        lo, hi = [0.0, log_lo, exp_lo, log_lo, exp_lo, 0.0], [np.inf, log_hi, exp_hi, log_hi, exp_hi, np.inf]
    x0 = np.clip(x0, np.add(lo, 1e-9), np.subtract(hi, 1e-9))
    res = least_squares(lambda x: law(unpack(x), d.params, d.s1, d.s2) - d.loss, x0, bounds=(lo, hi), x_scale="jac")
    theta = np.asarray(unpack(res.x), dtype=np.float64)
    if np.sum((law(theta, d.params, d.s1, d.s2) - d.loss) ** 2) > best_sse:  # refinement never makes it worse
        theta = np.asarray(best, dtype=np.float64)
    return theta


@dataclass
class CurveLawFit:
    """A fitted LR-annealing law with bootstrap replicates; see `summary()`."""

    params: dict[str, float]
    samples: np.ndarray  # (bootstrap, 6) parameter replicates
    residual_sd: float  # sd of one eval's residual, added to every band
    momentum_decay: float
    min_progress: float
    n_points: int
    n_runs: int
    run_params: list[float]  # N of each fitted run
    bootstrap: str  # "runs" (clustered) or "residuals" (one or two runs)
    seed: int
    lr_ref: float | None = None  # the LR that S1/S2 are measured in units of
    kind: str = "curve_law"

    @property
    def theta(self) -> np.ndarray:
        return np.array([self.params[k] for k in PARAM_NAMES])

    # The result protocol of every fit (delphi.fits.results.FitLike): params, intervals,
    # diagnostics, status, summary(), to_json().

    @property
    def intervals(self) -> dict[str, tuple[float, float]]:
        """90% bootstrap interval of each parameter; {} without bootstrap replicates."""
        if not len(self.samples):
            return {}
        return {
            k: tuple(float(v) for v in np.quantile(self.samples[:, i], INTERVAL_QUANTILES))
            for i, k in enumerate(PARAM_NAMES)
        }

    @property
    def at_bound(self) -> list[str]:
        """Parameters on a bound of the refinement's search region. The N term (A, alpha) is only
        searched with two or more model sizes; C = 0 is not listed, since a ladder without LR decay
        has S2 = 0 and no C to fit."""
        p, out = self.params, []
        if p["E"] <= 0:
            out.append("E")
        amplitudes, exponents = ["B"], ["beta"]
        if len(set(self.run_params)) >= 2:
            amplitudes, exponents = ["A", "B"], ["alpha", "beta"]
        for k in amplitudes:
            if p[k] <= 0 or min(abs(math.log(p[k]) - b) for b in LOG_AMPLITUDE_BOUNDS) < BOUND_TOLERANCE:
                out.append(k)
        out += [k for k in exponents if min(abs(p[k] - b) for b in EXPONENT_BOUNDS) < BOUND_TOLERANCE]
        return [k for k in PARAM_NAMES if k in out]

    @property
    def status(self) -> FitStatus:
        """ok or at_bound. least_squares' convergence flag is not kept (the curve-law JSON has no
        place for it), so a curve law is never "not_converged"."""
        return fit_status(True, self.at_bound)

    @property
    def diagnostics(self) -> FitDiagnostics:
        return FitDiagnostics.from_mapping(
            {
                "at_bound": self.at_bound,
                "residual_sd_nats": self.residual_sd,
                "n_runs": self.n_runs,
                "bootstrap": self.bootstrap,
                "n_bootstrap": len(self.samples),
            }
        )

    def predict(self, params: float, s1, s2) -> dict[str, np.ndarray]:
        """Median and band edges of an observed eval loss at (N, S1, S2) points."""
        s1, s2 = np.atleast_1d(np.asarray(s1, float)), np.atleast_1d(np.asarray(s2, float))
        median = law(self.theta, params, s1, s2)
        out = {"loss": median}
        if len(self.samples):
            reps = np.stack([law(t, params, s1, s2) for t in self.samples])  # (B, points)
            rng = np.random.default_rng(self.seed + 1)
            reps = reps + rng.normal(0.0, self.residual_sd, size=reps.shape)
            for name, q in BAND_QUANTILES.items():
                edge = np.quantile(reps, q, axis=0)
                out[name] = np.minimum(edge, median) if name.startswith("lo") else np.maximum(edge, median)
        return out

    def final_loss(self, params: float) -> float:
        """Loss after infinitely long training at N (the law's L0(N))."""
        E, A, alpha = self.theta[:3]
        return float(E + A * params**-alpha)

    def summary(self) -> str:
        p = self.params
        lines = [
            f"LR-annealing curve law (Tissue et al. 2024) fitted to {self.n_runs} runs, {self.n_points} eval points",
            f"  L = E + A N^-alpha + B S1^-beta - C S2   (S1 in LR-weighted tokens, lambda = {self.momentum_decay})",
        ]
        for k in PARAM_NAMES:
            if len(self.samples):
                lo, hi = self.intervals[k]
                lines.append(f"  {k:>5} = {p[k]:.6g}   90% [{lo:.4g}, {hi:.4g}]")
            else:
                lines.append(f"  {k:>5} = {p[k]:.6g}")
        lines.append(
            f"  residual sd of one eval: {self.residual_sd:.4g} nats ({self.bootstrap} bootstrap, {len(self.samples)} reps)"
        )
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "method": "tissue2024_lr_annealing_with_size_term",
            "form": "E + A*N^-alpha + B*S1^-beta - C*S2",
            "params": self.params,
            "intervals": {k: list(self.intervals[k]) if len(self.samples) else None for k in PARAM_NAMES},
            "samples": self.samples.tolist(),
            "residual_sd": self.residual_sd,
            "momentum_decay": self.momentum_decay,
            "min_progress": self.min_progress,
            "n_points": self.n_points,
            "n_runs": self.n_runs,
            "run_params": self.run_params,
            "bootstrap": self.bootstrap,
            "seed": self.seed,
            "lr_ref": self.lr_ref,
        }

    @classmethod
    def from_json(cls, d: dict) -> "CurveLawFit":
        if not isinstance(d, dict) or d.get("kind") != "curve_law":
            kind = d.get("kind") if isinstance(d, dict) else type(d).__name__
            raise DelphiError(f"curve fit: kind is {quoted(kind)}, expected 'curve_law'")
        return cls(
            params={k: float(d["params"][k]) for k in PARAM_NAMES},
            samples=np.asarray(d.get("samples") or np.zeros((0, 6)), dtype=np.float64).reshape(-1, 6),
            residual_sd=float(d["residual_sd"]),
            momentum_decay=float(d["momentum_decay"]),
            min_progress=float(d["min_progress"]),
            n_points=int(d["n_points"]),
            n_runs=int(d["n_runs"]),
            run_params=[float(x) for x in d["run_params"]],
            bootstrap=d["bootstrap"],
            seed=int(d["seed"]),
            lr_ref=d.get("lr_ref"),
        )


def fit_curve_law(
    curves: Sequence[Curve],
    *,
    bootstrap: int = 200,
    seed: int = 0,
    min_progress: float = DEFAULT_MIN_PROGRESS,
    momentum_decay: float = TISSUE_MOMENTUM_DECAY,
    lr_ref: float | None = None,
) -> CurveLawFit:
    """Fit the law to every curve jointly; bootstrap whole runs (or residuals with < 3 runs)."""
    curves = [c for c in curves if c.loss.size]
    d = _stack(curves, min_progress)
    single = len({c.params for c in curves}) < 2
    theta = _fit_once(d, single)
    resid = law(theta, d.params, d.s1, d.s2) - d.loss
    n_free = 4 if single else 6
    resid_sd = float(np.sqrt(np.sum(resid**2) / max(d.loss.size - n_free, 1)))

    rng = np.random.default_rng(seed)
    reps = []
    by_run = len(curves) >= 3
    for _ in range(bootstrap):
        if by_run:
            pick = rng.integers(0, len(curves), len(curves))
            sample = [curves[i] for i in pick]
            if len({c.params for c in sample}) < 2 and not single:
                continue  # a resample with one size cannot identify the N term
            reps.append(_fit_once(_stack(sample, min_progress), single, start=theta))
        else:
            fitted = law(theta, d.params, d.s1, d.s2)
            boot = _Stacked(d.params, d.s1, d.s2, fitted + rng.choice(resid, resid.size), d.run)
            reps.append(_fit_once(boot, single, start=theta))
    return CurveLawFit(
        params=dict(zip(PARAM_NAMES, map(float, theta))),
        samples=np.asarray(reps, dtype=np.float64).reshape(-1, 6),
        residual_sd=resid_sd,
        momentum_decay=momentum_decay,
        min_progress=min_progress,
        n_points=int(d.loss.size),
        n_runs=len(curves),
        run_params=[c.params for c in curves],
        bootstrap="runs" if by_run else "residuals",
        seed=seed,
        lr_ref=lr_ref,
    )


# --------------------------------------------------------------------------- hero trajectory


def predict_trajectory(
    fit: CurveLawFit,
    hero: Any,
    *,
    final_anchor: float | None = None,
) -> dict[str, Any]:
    """Predicted eval loss with 50%/90% bands at every eval point of a TrainConfig.

    With `final_anchor` (the scaling law's final-loss median), the median curve is
    shifted by a constant so that its end agrees with it; the shift is returned as
    `anchor_offset` so the file can say how far the two predictions were apart, and
    the bands are widened to cover the unshifted curve law's bands as well.
    """
    n = count_params(hero.model).nonembedding
    lr_ref = fit.lr_ref or hero.optim.lr
    lr = hero.optim.lr / lr_ref * lr_factors(hero.optim, hero.steps)
    s1, s2 = annealing_areas(
        lr, hero.tokens_per_step, warmup_updates=warmup_steps(hero.optim, hero.steps), momentum_decay=fit.momentum_decay
    )
    steps = np.asarray(eval_steps(hero.steps, hero.eval_every))
    pred = fit.predict(n, s1[steps], s2[steps])
    offset = 0.0 if final_anchor is None else float(final_anchor - pred["loss"][-1])
    points = []
    for k, step in enumerate(steps):
        point = {"step": int(step), "tokens": int(step * hero.tokens_per_step), "loss": float(pred["loss"][k] + offset)}
        for name in BAND_QUANTILES:
            if name in pred:
                # The band is the union of the anchored and the unanchored curve law's
                # bands: a disagreement between the two laws is uncertainty, not noise.
                edge = (min if name.startswith("lo") else max)(pred[name][k] + offset, pred[name][k])
                point[name] = float(edge)
        points.append(point)
    return {
        "params": int(n),
        "points": points,
        "curve_end_unanchored": float(pred["loss"][-1]),
        "anchor_offset": offset,
    }


# --------------------------------------------------------------------------- backtest


BACKTEST_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def backtest_curve_law(
    curves: Sequence[Curve], *, bootstrap: int = 100, seed: int = 0, min_progress: float = DEFAULT_MIN_PROGRESS
) -> dict:
    """Fit on every size but the largest; predict the largest rung's whole curve.

    Among the runs at the largest N the one with the most tokens is the target.
    Reports the relative error (predicted - actual) / actual at the eval points
    nearest 25/50/75/100% of its tokens, and whether each fell inside the 90% band.
    """
    sizes = sorted({c.params for c in curves})
    if len(sizes) < 3:
        raise DelphiError(f"curve backtest: need >= 3 model sizes, got {len(sizes)}")
    train = [c for c in curves if c.params < sizes[-1]]
    target = max((c for c in curves if c.params == sizes[-1]), key=lambda c: c.total_tokens)
    fit = fit_curve_law(train, bootstrap=bootstrap, seed=seed, min_progress=min_progress)
    pred = fit.predict(target.params, target.s1, target.s2)
    rows = []
    for frac in BACKTEST_FRACTIONS:
        k = int(np.argmin(np.abs(target.tokens - frac * target.total_tokens)))
        row = {
            "fraction": frac,
            "tokens": float(target.tokens[k]),
            "actual": float(target.loss[k]),
            "predicted": float(pred["loss"][k]),
            "rel_error": float((pred["loss"][k] - target.loss[k]) / target.loss[k]),
        }
        if "lo90" in pred:
            row["in_90"] = bool(pred["lo90"][k] <= target.loss[k] <= pred["hi90"][k])
        rows.append(row)
    return {
        "target_run": target.run_id,
        "target_params": target.params,
        "train_params": sorted({c.params for c in train}),
        "extrapolation_params": target.params / max(c.params for c in train),
        "points": rows,
        "max_abs_rel_error": max(abs(r["rel_error"]) for r in rows),
        "fit": fit.to_json() | {"samples": []},
    }
