"""The calibration model: how far a law's prediction misses beyond its fitted budgets, fitted on public sweeps.

On the log error e = ln(predicted / observed) of `delphi.fits.beyond` rows, per method:

    e ~ shift(f) + sd(f) * eps,   shift(f) = b0 + b1 ln f,   sd(f)^2 = base^2 + (s0 + s1 ln f)^2

with f the extrapolation factor, `base` the fit-only relative sd (training residual scatter) and eps
standardised. s0 + s1 ln f is the simplest term that is nonzero one budget out (a law misfits the top of
its own ladder) and grows with the decades of extrapolation; a power s f^p has no floor at f -> 1. The
shift is the law's systematic error, applied only where the sources agree on its sign (SHIFT_RULES):
an error whose sign changes from sweep to sweep is not systematic. b0, b1 are fitted by weighted least
squares, s0, s1 >= 0 by weighted Gaussian likelihood; the 50% and 90% half-widths are q50 sd and q90 sd
with q the weighted quantiles of |e - shift| / sd, each point's taken under the calibration fitted
without its source (jackknife+: Barber et al. 2021, "Predictive inference with the jackknife+"), so
the tails are the data's. Every source weighs the same (weight 1 / its points). `loso` scores each
source with a calibration fitted on the others. Measurements: docs/notebook.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from delphi.errors import DelphiError
from delphi.fits.intervals import Z_90

MODEL = (
    "ln(pred/obs) ~ shift + sd * eps; shift = b0 + b1 ln f (where the sources agree on its sign); sd^2 = base^2 + (s0 + s1 ln f)^2; "
    "50%/90% half-widths q50*sd, q90*sd (weighted empirical quantiles of |standardised residual|, each point's under "
    "the shift and sd fitted without its source: jackknife+); "
    "every source weighs the same"
)
SHIFT_RULES = ("agree", "always", "never")
SHIFT_AGREEMENT = 0.75  # share of the calibration's weight (sources) whose mean error has the shift's sign; judgment
SD_START = (0.005, 0.005)  # start of the likelihood search: 0.5% and 0.5% per e-fold, the public errors' scale
SD_BOUNDS = ((0.0, 0.5), (0.0, 0.5))  # a relative sd above 50% is not a prediction


@dataclass(frozen=True)
class MethodCalibration:
    """One method's calibrated shift and model-error term (module docstring)."""

    method: str
    shift0: float
    shift1: float
    sd0: float
    sd1: float
    q50: float
    q90: float
    max_factor: float
    n_points: int
    sources: tuple[str, ...]
    shift_applied: bool = True

    def shift(self, factor: float | np.ndarray) -> float | np.ndarray:
        return (self.shift0 + self.shift1 * np.log(factor)) if self.shift_applied else 0.0 * np.log(factor)

    def model_sd(self, factor: float | np.ndarray) -> float | np.ndarray:
        return self.sd0 + self.sd1 * np.log(factor)

    def total_sd(self, factor: float | np.ndarray, base_sd_rel: float | np.ndarray) -> float | np.ndarray:
        return np.hypot(base_sd_rel, self.model_sd(factor))

    def predict(self, predicted_loss: float, factor: float, base_sd_rel: float) -> dict[str, Any]:
        """The calibrated point and 50%/90% intervals for a law's prediction `factor` beyond its fit."""
        point = float(predicted_loss * math.exp(-float(self.shift(factor))))
        sd = float(self.total_sd(factor, base_sd_rel))
        return {
            "loss": point,
            "loss_50": [point * math.exp(-self.q50 * sd), point * math.exp(self.q50 * sd)],
            "loss_90": [point * math.exp(-self.q90 * sd), point * math.exp(self.q90 * sd)],
            "sd_rel": sd,
            "model_sd_rel": float(self.model_sd(factor)),
            "shift_log": float(self.shift(factor)),
            "factor": float(factor),
            "beyond_calibrated_range": bool(factor > self.max_factor * (1 + 1e-9)),
            "max_calibrated_factor": self.max_factor,
        }

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "sources": list(self.sources)}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> "MethodCalibration":
        try:
            return cls(**{**data, "sources": tuple(data["sources"])})
        except (KeyError, TypeError) as e:
            raise DelphiError(f"{where}: not a method calibration ({e})") from None


def _source_weights(sources: pd.Series) -> np.ndarray:
    counts = sources.map(sources.value_counts())
    w = 1.0 / counts.to_numpy(float)
    return w / w.sum()


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-quantile of `values` under `weights` (interpolated on the weighted CDF's midpoints)."""
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cdf = (np.cumsum(w) - 0.5 * w) / w.sum()
    return float(np.interp(q, cdf, v))


def shift_agreement(rows: pd.DataFrame) -> float:
    """The share of sources (each weighing the same) whose mean log error has the sign of the pooled
    source-weighted mean."""
    per_source = rows.groupby("source")["log_error"].mean()
    return float(np.mean(np.sign(per_source) == np.sign(per_source.mean())))


def _fit_shift_and_sd(rows: pd.DataFrame, shift: str) -> tuple[float, float, float, float, bool]:
    """(b0, b1, s0, s1, shift applied) of one method's rows (module docstring)."""
    w = _source_weights(rows["source"])
    ln_f = np.log(rows["factor"].to_numpy(float))
    e = rows["log_error"].to_numpy(float)
    base = rows["base_sd_rel"].to_numpy(float)
    apply_shift = shift == "always" or (shift == "agree" and shift_agreement(rows) >= SHIFT_AGREEMENT)
    if apply_shift:
        design = np.column_stack([np.ones_like(ln_f), ln_f]) * np.sqrt(w)[:, None]
        b0, b1 = np.linalg.lstsq(design, e * np.sqrt(w), rcond=None)[0]
    else:
        b0 = b1 = 0.0
    resid = e - (b0 + b1 * ln_f)

    def nll(s: np.ndarray) -> float:
        var = base**2 + (s[0] + s[1] * ln_f) ** 2 + 1e-12
        return float(np.sum(w * (np.log(var) + resid**2 / var)))

    best = minimize(nll, np.array(SD_START), method="L-BFGS-B", bounds=SD_BOUNDS)
    s0, s1 = (float(v) for v in best.x)
    return float(b0), float(b1), s0, s1, bool(apply_shift)


def _standardised_errors(rows: pd.DataFrame, b0: float, b1: float, s0: float, s1: float) -> np.ndarray:
    """|e - shift| / sd of each row under one fitted calibration."""
    ln_f = np.log(rows["factor"].to_numpy(float))
    sd = np.sqrt(rows["base_sd_rel"].to_numpy(float) ** 2 + (s0 + s1 * ln_f) ** 2 + 1e-12)
    return np.abs(rows["log_error"].to_numpy(float) - (b0 + b1 * ln_f)) / sd


def out_of_source_errors(rows: pd.DataFrame, shift: str) -> pd.Series:
    """Each row's standardised error under the shift and sd fitted without its source (module docstring:
    out-of-source quantiles)."""
    parts = []
    for source in rows["source"].unique():
        others, own = rows[rows["source"] != source], rows[rows["source"] == source]
        b0, b1, s0, s1, _ = _fit_shift_and_sd(others, shift)
        parts.append(pd.Series(_standardised_errors(own, b0, b1, s0, s1), index=own.index))
    return pd.concat(parts)


def fit_method_calibration(rows: pd.DataFrame, method: str, shift: str = "agree") -> MethodCalibration:
    """Calibrate one method on scored rows (columns source, factor, log_error, base_sd_rel). `shift`:
    SHIFT_RULES (module docstring); the quantiles from `out_of_source_errors`."""
    if shift not in SHIFT_RULES:
        raise DelphiError(f"calibration: shift rule {shift!r}, expected one of {SHIFT_RULES}")
    rows = rows[(rows["method"] == method) & rows["log_error"].notna()]
    if rows["source"].nunique() < 3:
        raise DelphiError(
            f"calibration: method {method!r} has scored rows from {rows['source'].nunique()} source(s); need >= 3 "
            "(the quantiles come from each source scored by a calibration fitted on >= 2 others)"
        )
    b0, b1, s0, s1, apply_shift = _fit_shift_and_sd(rows, shift)
    z = out_of_source_errors(rows, shift)
    w = _source_weights(rows.loc[z.index, "source"])
    return MethodCalibration(
        method,
        b0,
        b1,
        s0,
        s1,
        weighted_quantile(z.to_numpy(), w, 0.50),
        weighted_quantile(z.to_numpy(), w, 0.90),
        float(rows["factor"].max()),
        len(rows),
        tuple(sorted(rows["source"].unique())),
        apply_shift,
    )


def calibrate(rows: pd.DataFrame, shift: str = "agree") -> dict[str, MethodCalibration]:
    """Every method's calibration on these rows."""
    return {m: fit_method_calibration(rows, m, shift) for m in rows["method"].unique()}


def apply_calibration(rows: pd.DataFrame, calibrations: dict[str, MethodCalibration]) -> pd.DataFrame:
    """Rows with the calibrated prediction (cal_*) and the sources each calibration was fitted on."""
    out = rows.copy()
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "cal_predicted_loss",
            "cal_rel_error",
            "cal_lo_50",
            "cal_hi_50",
            "cal_lo_90",
            "cal_hi_90",
            "cal_covered_50",
            "cal_covered_90",
            "cal_beyond_range",
            "calibration_sources",
        )
    }
    for r in rows.itertuples():
        cal = calibrations.get(r.method)
        if cal is None or not isinstance(r.log_error, float) or math.isnan(r.log_error):
            for k in cols:
                cols[k].append(None)
            continue
        p = cal.predict(r.predicted_loss, r.factor, r.base_sd_rel)
        obs = r.observed_best_loss
        values = (
            p["loss"],
            p["loss"] / obs - 1,
            *p["loss_50"],
            *p["loss_90"],
            bool(p["loss_50"][0] <= obs <= p["loss_50"][1]),
            bool(p["loss_90"][0] <= obs <= p["loss_90"][1]),
            p["beyond_calibrated_range"],
            "|".join(cal.sources),
        )
        for k, v in zip(cols, values):
            cols[k].append(v)
    for k, v in cols.items():
        out[k] = v
    return out


def loso(
    rows: pd.DataFrame, calibrate_fn: Callable[[pd.DataFrame], dict[str, MethodCalibration]] = calibrate
) -> pd.DataFrame:
    """Leave one source out: each source's rows scored with a calibration fitted on the others."""
    scored = []
    for source in rows["source"].unique():
        calibrations = calibrate_fn(rows[rows["source"] != source])
        scored.append(apply_calibration(rows[rows["source"] == source], calibrations))
    out = pd.concat(scored, ignore_index=True)
    assert_out_of_sample(out)
    return out


def assert_out_of_sample(scored: pd.DataFrame) -> None:
    """DelphiError if any row was scored by a calibration fitted on its own source."""
    for r in scored.itertuples():
        if r.calibration_sources and r.source in str(r.calibration_sources).split("|"):
            raise DelphiError(
                f"calibration: source {r.source!r} was scored with a calibration fitted on itself "
                f"(method {r.method}, budget {r.budget:g}); leave-one-source-out is broken"
            )


def fit_only_sd_rel(
    predicted_loss: float, interval_90: Sequence[float] | None, residual_scatter_nats: float | None = None
) -> float:
    """The fit-only relative sd of a prediction: its 90% interval's half-width / z_0.95 / the prediction
    (0 without an interval), widened in quadrature by the residual scatter when given."""
    half = 0.0
    if interval_90 is not None and interval_90[0] is not None and interval_90[1] is not None:
        half = (float(interval_90[1]) - float(interval_90[0])) / 2
    if residual_scatter_nats:
        half = math.hypot(half, Z_90 * float(residual_scatter_nats))
    return half / Z_90 / predicted_loss
