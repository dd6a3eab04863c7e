"""Intervals that know how far they extrapolate, calibrated on public sweeps by leave-one-source-out.

A law's prediction of the best loss at a budget `factor` times beyond its largest fitted budget
misses by more than its fit noise: the law is not the truth, and the gap grows with distance
(benchmarks/backtests_summary.csv: fit-noise 90% intervals covered 61-77%). The model, per method,
on the log error e = ln(predicted / observed) of `delphi.fits.beyond` rows:

    e ~ shift(f) + sd(f) * eps,   shift(f) = b0 + b1 ln f,   sd(f)^2 = base^2 + (s0 + s1 ln f)^2

with f the extrapolation factor, `base` the fit-only relative sd (training residual scatter), and
eps standardised. Why this form: s0 + s1 ln f is the simplest term that is nonzero one budget out
(a law misfits the top of its own ladder) and grows with the decades of extrapolation, as the
public errors do (isoFLOP law: 0.6% at 1-3x, 1.7% at 3-10x, 3.5% at 10-30x, roughly linear in
ln f); a power s f^p grows faster than the data show beyond 30x and has no floor at f -> 1. The
shift is the law's systematic error (the isoFLOP law is optimistic, VPNLS and the parametric
law pessimistic, on every public source), linear in ln f for the same reason. It is applied only
where the calibration sources agree on its sign (SHIFT_AGREEMENT of them, weighted, share the sign
of the mean error; rule "agree", the default): an error whose sign changes from sweep to sweep is
not systematic, and subtracting the mean of a few disagreeing sources moves the others' predictions
away from the truth (the asymptotic law on the public sweeps: shifted, 3-10x error 1.76%;
unshifted, 1.22%). b0, b1 are fitted
by weighted least squares, s0, s1 >= 0 by weighted Gaussian likelihood; the 50% and 90%
half-widths are q50 sd and q90 sd with q the weighted quantiles of |e - shift| / sd over the
calibration points, so the tails are the data's, not a normal's. Every source weighs the same
(weight 1 / its points): misfitting's 14 budgets must not outvote Marin's 6.

Out-of-source quantiles: each point's |e - shift| / sd is taken under the shift and sd fitted without its
source (the jackknife+ rule: Barber et al. 2021, "Predictive inference with the jackknife+"), because
a new sweep meets the calibration out of sample. In-sample quantiles covered 83% of the public
points 3-10x out (79% beyond 30x) in leave-one-source-out scoring; out-of-source ones 88% (83%):
`delphi fit coverage`, issue 43.

Leave-one-source-out (`loso`): the calibration applied to a source's predictions is fitted on
the other sources only; `assert_out_of_sample` checks every scored row. The committed file
(delphi/fits/data/beyond_calibration.json, SCHEMA_VERSION) is fitted on every public source, with
its provenance, the per-source LOSO table behind method choice (`choose_method`) and the largest
calibrated factor per method (a prediction beyond it is flagged `beyond_calibrated_range`).

`calibrate_point` puts one prediction's calibrated interval beside the law's own (issue 43): a pure
function of the method, the prediction, its 90% interval, its extrapolation factor and a calibration
loaded by `load_checked_calibration` (schema, numbers and source hash checked). A prediction beyond
the furthest calibrated factor, or of a method without an entry, keeps the law's own interval,
marked uncalibrated with the reason. `delphi fit backtest` shows both (`calibrate_backtest`,
`calibrate_all_holdouts`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from delphi.errors import DelphiError
from delphi.fits.beyond import ENSEMBLES
from delphi.fits.intervals import Z_90

SCHEMA_VERSION = 1
KIND = "delphi_beyond_calibration"
DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "beyond_calibration.json"
MODEL = (
    "ln(pred/obs) ~ shift + sd * eps; shift = b0 + b1 ln f (where the sources agree on its sign); sd^2 = base^2 + (s0 + s1 ln f)^2; "
    "50%/90% half-widths q50*sd, q90*sd (weighted empirical quantiles of |standardised residual|, each point's under "
    "the shift and sd fitted without its source: jackknife+); "
    "every source weighs the same"
)
SHIFT_RULES = ("agree", "always", "never")
SHIFT_AGREEMENT = 0.75  # share of the calibration's weight (sources) whose mean error has the shift's sign; judgment
SD_START = (0.005, 0.005)  # start of the likelihood search: 0.5% and 0.5% per e-fold, the public errors' scale
SD_BOUNDS = ((0.0, 0.5), (0.0, 0.5))  # a relative sd above 50% is no longer a prediction
# Method choice: how many of the most similar public sources decide, and how a difference in
# the number of budgets weighs against one in model size. Judgment, not measurement: four budgets
# (about the gap between Marin's 6 and Llama's 8-plus-2) count as much as a decade of model size.
SIMILAR_SOURCES = 3
# A method is eligible only if its calibrated 90% intervals covered at least this share of the
# similar sweeps' held-out points (LOSO): the issue's band is 85-95%; 80% leaves room for the few
# points (18-40) a choice rests on. If no method qualifies, every calibrated method competes.
MIN_CHOICE_COVERAGE_90 = 0.80
BUDGETS_PER_SIZE_DECADE = 4.0
SIZE_DECADE = 1.0


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


# --------------------------------------------------------------------------- the committed file


def calibration_document(
    rows: pd.DataFrame,
    features: dict[str, dict[str, float]],
    *,
    command: str,
    inputs: dict[str, str],
    shift: str = "agree",
    created: str | None = None,
) -> dict[str, Any]:
    """The calibration file: fitted on every source in `rows`, with the LOSO table behind method choice."""
    from delphi import __version__

    scored = loso(rows, lambda r: calibrate(r, shift))
    per_source = []
    for (source, method), g in scored.groupby(["source", "method"], sort=True):
        g = g[g["cal_rel_error"].notna()]
        if g.empty:
            continue
        per_source.append(
            {
                "source": source,
                "method": method,
                "n": len(g),
                "mean_abs_rel_error": float(g["cal_rel_error"].abs().mean()),
                "mean_abs_rel_error_uncalibrated": float(g["rel_error"].abs().mean()),
                "coverage_50": float(g["cal_covered_50"].astype(float).mean()),
                "coverage_90": float(g["cal_covered_90"].astype(float).mean()),
            }
        )
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "model": MODEL,
        "shift_rule": shift,
        "shift_agreement": SHIFT_AGREEMENT,
        "ensembles": {
            name: {
                "members": list(members),
                "prediction": "geometric mean of the members' predictions",
                "selected_on_public_data": True,
            }
            for name, members in ENSEMBLES.items()
        },
        "created": created,
        "delphi_version": __version__,
        "command": command,
        "inputs": inputs,
        "sources": features,
        "methods": {m: c.to_json() for m, c in calibrate(rows, shift).items()},
        "loso": per_source,
    }


def load_calibration(path: str | Path | None = None) -> dict[str, Any]:
    """The calibration file (default: the committed one), its schema checked; adds "path" and "sha256"."""
    path = Path(path) if path is not None else DEFAULT_PATH
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
    except FileNotFoundError:
        raise DelphiError(f"{path}: calibration file not found") from None
    except (OSError, ValueError) as e:
        raise DelphiError(f"{path}: not a readable JSON calibration file ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise DelphiError(
            f"{path}: key 'kind' = {data.get('kind') if isinstance(data, dict) else None!r}, expected {KIND!r}"
        )
    if data.get("schema_version") != SCHEMA_VERSION:
        raise DelphiError(
            f"{path}: key 'schema_version' = {data.get('schema_version')!r}, this delphi reads {SCHEMA_VERSION}"
        )
    for key in ("methods", "sources", "loso"):
        if key not in data:
            raise DelphiError(f"{path}: missing key {key!r}")
    data["methods_parsed"] = {
        m: MethodCalibration.from_json(c, f"{path}: methods.{m}") for m, c in data["methods"].items()
    }
    data["path"] = str(path)
    data["sha256"] = hashlib.sha256(raw).hexdigest()
    return data


def calibration_provenance(calibration: dict[str, Any]) -> dict[str, Any]:
    """What a fit or study JSON records about the calibration it applied."""
    path = Path(calibration["path"])
    shown = "delphi/fits/data/beyond_calibration.json (committed)" if path.resolve() == DEFAULT_PATH else str(path)
    return {
        "applied": True,
        "path": shown,
        "sha256": calibration["sha256"],
        "schema_version": calibration["schema_version"],
        "model": calibration["model"],
        "sources": sorted(calibration["sources"]),
        "command": calibration.get("command"),
    }


# --------------------------------------------------------------------------- method choice and the study


def similar_sources(
    features: dict[str, float], calibration: dict[str, Any], k: int = SIMILAR_SOURCES
) -> list[tuple[str, float]]:
    """The k public sources most like a sweep: (name, distance), distance = |decades of median model
    size apart| / SIZE_DECADE + |budgets apart| / BUDGETS_PER_SIZE_DECADE."""
    dist = []
    for name, f in calibration["sources"].items():
        d = (
            abs(f["log10_median_params"] - features["log10_median_params"]) / SIZE_DECADE
            + abs(f["n_budgets"] - features["n_budgets"]) / BUDGETS_PER_SIZE_DECADE
        )
        dist.append((name, float(d)))
    return sorted(dist, key=lambda t: (t[1], t[0]))[:k]


def source_likeness(features: dict[str, float], calibration: dict[str, Any]) -> dict[str, Any]:
    """The source check: how far a sweep lies from the calibration's sources, and how far the
    calibration has been carried out of sample. Distance as `calibration.similar_sources` measures it
    (decades of median model size, and budgets / BUDGETS_PER_SIZE_DECADE); the reach is the largest
    distance from any source to its nearest other source: leave-one-source-out scoring applied the
    calibration that far from what it was fitted on (the committed file: misfitting, 2.37 from Llama 3).
    `like` is whether the sweep lies within that reach."""
    sources = calibration["sources"]
    nearest = similar_sources(features, calibration, 1)
    reach = 0.0
    for name, f in sources.items():
        others = {"sources": {n: g for n, g in sources.items() if n != name}}
        if others["sources"]:
            reach = max(reach, similar_sources(f, others, 1)[0][1])
    distance = nearest[0][1] if nearest else math.inf
    return {
        "nearest_source": nearest[0][0] if nearest else None,
        "distance": float(distance),
        "reach": float(reach),
        "like": bool(distance <= reach),
    }


def choose_method(
    features: dict[str, float],
    calibration: dict[str, Any],
    methods: Sequence[str] | None = None,
    k: int = SIMILAR_SOURCES,
) -> dict[str, Any]:
    """The method with the lowest calibrated out-of-sample (LOSO) mean |error| on the k public sources
    most like the sweep (`similar_sources`), among methods with a calibration whose calibrated 90%
    intervals covered >= MIN_CHOICE_COVERAGE_90 there. Ties: 90% coverage nearer 90%. Returns the choice, the table behind it and the sources."""
    near = similar_sources(features, calibration, k)
    names = {n for n, _ in near}
    allowed = set(calibration["methods"]) if methods is None else set(methods) & set(calibration["methods"])
    if not allowed:
        raise DelphiError(
            f"method choice: none of {sorted(methods or [])} has a calibration "
            f"(calibrated: {sorted(calibration['methods'])})"
        )
    table = []
    for method in sorted(allowed):
        part = [r for r in calibration["loso"] if r["method"] == method and r["source"] in names]
        n = sum(r["n"] for r in part)
        if not n:
            continue
        mean = lambda key: sum(r[key] * r["n"] for r in part) / n  # noqa: B023  (called at once, inside the loop)
        table.append(
            {
                "method": method,
                "n": n,
                "mean_abs_rel_error": mean("mean_abs_rel_error"),
                "mean_abs_rel_error_uncalibrated": mean("mean_abs_rel_error_uncalibrated"),
                "coverage_50": mean("coverage_50"),
                "coverage_90": mean("coverage_90"),
            }
        )
    for r in table:
        r["eligible"] = r["coverage_90"] >= MIN_CHOICE_COVERAGE_90
    if not any(r["eligible"] for r in table):
        for r in table:
            r["eligible"] = True
    table.sort(key=lambda r: (not r["eligible"], r["mean_abs_rel_error"], abs(r["coverage_90"] - 0.9)))
    return {
        "method": table[0]["method"],
        "table": table,
        "similar_sources": [{"source": n, "distance": d} for n, d in near],
        "features": features,
        "rule": f"lowest calibrated leave-one-source-out mean |error| on the {k} public sources most like the sweep "
        f"(model size and number of budgets), among methods whose calibrated 90% intervals covered >= "
        f"{MIN_CHOICE_COVERAGE_90:.0%} there",
    }


def calibrated_prediction(
    method: str,
    predicted_loss: float,
    interval_90: Sequence[float] | None,
    factor: float,
    calibration: dict[str, Any],
    residual_scatter_nats: float | None = None,
) -> dict[str, Any]:
    """A law's prediction `factor` beyond its largest fitted budget, with the calibrated point and
    intervals. The fit-only sd is the 90% interval's half-width / z_0.95 (widened in quadrature by
    the residual scatter when given, as `backtest.predictive_interval`)."""
    cal = calibration["methods_parsed"].get(method)
    if cal is None:
        return {"applied": False, "reason": f"no calibration for method {method!r} in {calibration['path']}"}
    base_sd_rel = fit_only_sd_rel(predicted_loss, interval_90, residual_scatter_nats)
    out = cal.predict(predicted_loss, factor, base_sd_rel)
    return {
        **out,
        "method": method,
        "uncalibrated_loss": float(predicted_loss),
        "base_sd_rel": base_sd_rel,
        **calibration_provenance(calibration),
    }


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


# The calibration key of a fit (the `delphi fit` method that produced it), by (kind, method).
FIT_METHOD_KEYS = {
    ("isoflop", "approach2"): "isoflop",
    ("parametric", "vpnls"): "vpnls",
    ("parametric", "approach3"): "parametric",
    ("frontier", "frontier-free-weighted"): "asymptotic",
}
# The laws that can size a hero (they predict N*(C)); a study's primary law is chosen among them.
PRIMARY_CAPABLE = ("isoflop", "parametric", "vpnls")


def calibration_key(kind: str, method: str) -> str | None:
    """The calibration entry for a fit of this kind and method (None: not calibrated)."""
    if (kind, method) in FIT_METHOD_KEYS:
        return FIT_METHOD_KEYS[(kind, method)]
    return (
        "frontier" if kind == "frontier" and method.startswith("frontier-free") and "weighted" not in method else None
    )


def table_features(table: pd.DataFrame) -> dict[str, float]:
    """The sweep features method choice compares (`beyond.sweep_features`) of a results table's
    isoFLOP rows (anchor rungs are not part of any budget's sweep)."""
    from delphi.fits.beyond import sweep_features
    from delphi.fits.data import isoflop_rows

    return sweep_features(isoflop_rows(table))


def choose_primary(
    table: pd.DataFrame, fits: Sequence[str], calibration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A study's `primary_fit: auto`: `choose_method` on the table's sweep features (as `calibrate_final`
    computes them), among the laws that can size a hero (PRIMARY_CAPABLE) that the study fits. The
    choice, its table and the calibration's provenance, to be recorded once and never re-chosen."""
    candidates = [m for m in PRIMARY_CAPABLE if m in fits]
    if not candidates:
        raise DelphiError(
            f"primary_fit: auto chooses among {list(PRIMARY_CAPABLE)}, and fits {list(fits)} has none of them"
        )
    calibration = calibration if calibration is not None else load_calibration()
    choice = choose_method(table_features(table), calibration, candidates)
    return {**choice, "candidates": candidates, "calibration": calibration_provenance(calibration)}


def calibrate_final(
    fit: Any, final: dict[str, Any], compute: float, table: pd.DataFrame, calibration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The calibrated version of a hero's `final` prediction (prereg's {loss, loss_50, loss_90}): the
    shift and model-error term of the fit's method at the hero's extrapolation factor (compute / the
    table's largest isoFLOP budget), with the method choice by evidence for this ladder. The fit-only
    sd is `final`'s 90% half-width / z_0.95 (bootstrap and run noise already in it)."""
    from delphi.fits.data import isoflop_rows

    calibration = calibration if calibration is not None else load_calibration()  # a broken file is loud (exit 2)
    top = float(isoflop_rows(table)["budget"].max())
    factor = float(compute) / top
    key = calibration_key(fit.kind, fit.method)
    choice = choose_method(table_features(table), calibration, PRIMARY_CAPABLE)
    out: dict[str, Any]
    if key is None:
        out = {"applied": False, "reason": f"no calibration for a {fit.kind} fit by {fit.method}"}
    elif factor <= 1:
        out = {
            "applied": False,
            "reason": f"the hero ({compute:.3g} FLOPs) is not beyond the ladder's top budget {top:.3g}",
        }
    else:
        out = calibrated_prediction(key, float(final["loss"]), final.get("loss_90"), factor, calibration)
    out["top_budget"] = top
    out["source_likeness"] = source_likeness(table_features(table), calibration)
    recorded = calibration.get("inputs") if isinstance(calibration.get("inputs"), dict) else {}
    out["table_is_calibration_source"] = (
        table.attrs.get("sha256") in recorded.values()
    )  # its calibration is then in-sample
    out["method_choice"] = choice
    out["method_choice"]["fitted_method"] = key
    out["method_choice"]["agrees"] = key == choice["method"]
    return out


def calibrated_status(cal: dict[str, Any] | None) -> tuple[str | None, str]:
    """(status, reason) of a calibrated prediction, from `calibrate_point` (which says) or
    `calibrate_final` (which says whether it applied and whether it lies beyond the calibrated
    range): CALIBRATED, BEYOND_RANGE, NO_ENTRY; (None, "") without one."""
    if not cal:
        return None, ""
    if "status" in cal:
        return cal["status"], str(cal.get("reason") or "")
    if not cal.get("applied"):
        return NO_ENTRY, str(cal.get("reason") or "not calibrated")
    if cal.get("beyond_calibrated_range"):
        return BEYOND_RANGE, (
            f"{cal['factor']:.4g}x is beyond {cal['method']}'s furthest calibrated factor "
            f"({cal['max_calibrated_factor']:.4g}x)"
        )
    return CALIBRATED, ""


def gate_uses_calibration(final: dict[str, Any]) -> bool:
    """Whether gate interval_width judges the calibrated interval: when `final` has an applied
    calibration and was corrected by neither probes nor a design's measured bias, whose outcomes
    beyond this design's own ladders then stand in for the public calibration. (The default study's
    isoFLOP law leans high where the public sweeps' leans low: the calibrated interval there is
    centred 2% above the sealed one; issue 43.)"""
    return bool((final.get("calibrated") or {}).get("applied")) and not {"probe_correction", "point_correction"} & set(
        final
    )


def interval_for_gate(final: dict[str, Any]) -> tuple[Sequence[float] | None, float, str, str | None]:
    """(90% interval, its centre, a note saying which, why the hero is beyond the calibration or None)
    for gate interval_width: the calibrated interval where `gate_uses_calibration`, else the sealed one."""
    cal = final.get("calibrated") or {}
    if gate_uses_calibration(final):
        beyond = None
        if cal.get("beyond_calibrated_range"):
            beyond = (
                f"the hero lies {cal['factor']:.3g}x beyond the ladder's top budget, farther out than any calibration "
                f"point ({cal['max_calibrated_factor']:.3g}x for {cal['method']}): the calibrated interval is an "
                f"extrapolation of the calibration itself; refusing to seal without --force"
            )
        return (
            cal.get("loss_90"),
            float(cal["loss"]),
            f"calibrated ({cal['method']}, {cal['factor']:.3g}x beyond the ladder) ",
            beyond,
        )
    note = "sealed (corrected by the design's measured bias) " if "point_correction" in final else ""
    return final.get("loss_90"), float(final["loss"]), note, None


def report_lines(final: dict[str, Any], primary_fit: str | None = None, primary_law: str | None = None) -> list[str]:
    """Markdown for a study report: the primary law's calibrated prediction, and the method choice on
    the public sweeps beside it. `primary_fit` is the study's setting (a law, or "auto") and
    `primary_law` the law it resolved to: they say why the primary law made the sealed prediction
    where the public-sweep evidence names another (a study that fixed its law)."""
    cal = (final or {}).get("calibrated")
    if not cal:
        return []
    lines = ["## Calibrated interval and method choice (issue 30)", ""]
    if cal.get("applied"):
        lo, hi = cal["loss_90"]
        lines.append(
            f"The {cal['method']} law's prediction {cal['uncalibrated_loss']:.4f}, {cal['factor']:.3g}x beyond the ladder's "
            f"top budget, calibrated on the public isoFLOP sweeps: {cal['loss']:.4f}, 90% [{lo:.4f}, {hi:.4f}] "
            f"(model-error sd {cal['model_sd_rel']:.2%}, total sd {cal['sd_rel']:.2%}; calibration {cal['path']}, "
            f"sha256 {cal['sha256'][:12]})."
        )
        if cal.get("beyond_calibrated_range"):
            lines.append(
                f"**The hero lies farther out than any calibration point** ({cal['factor']:.3g}x against "
                f"{cal['max_calibrated_factor']:.3g}x): the interval extrapolates the calibration itself."
            )
    else:
        lines.append(f"Not calibrated: {cal.get('reason')}.")
    choice = cal.get("method_choice")
    if choice:
        lines += [""] + method_choice_lines(
            choice,
            primary_note(choice["method"], primary_law or choice.get("fitted_method"), primary_fit),
            lead="Public-sweep evidence for which law extrapolates best on sweeps like this one.",
        )
    return lines + [""]


def primary_note(chosen: str, primary: str | None, primary_fit: str | None) -> str:
    """How the public-sweep method choice (`chosen`) stands to the study's primary law, the law that
    made the sealed prediction, given the study's `primary_fit` setting (None: not known)."""
    if primary is None:
        return "The study's primary law has no calibration entry; it made the sealed prediction all the same."
    if chosen == primary:
        return f"It names the study's primary law, {primary}, the law that made the sealed prediction."
    why = {
        None: "this evidence did not choose it",
        "auto": (
            "with `primary_fit: auto` the fit stage chose it once, among the laws this study fits "
            '(see "Primary law chosen by evidence")'
        ),
    }
    return (
        f"It differs from the study's primary law, {primary}, which made the sealed prediction all the same: "
        + why.get(
            primary_fit,
            f"the study fixes `primary_fit: {primary_fit}`, and a fixed primary law is not re-chosen by this evidence",
        )
        + "."
    )


def method_choice_lines(choice: dict[str, Any], note: str = "", lead: str = "") -> list[str]:
    """Markdown: a `choose_method` answer (`lead` before it, its rule and the choice, `note` after it)
    and the table behind it."""
    lines = [
        " ".join(
            part
            for part in (
                lead,
                f"Method choice ({choice['rule']}): **{choice['method']}**. "
                f"Similar sweeps: {', '.join(s['source'] for s in choice['similar_sources'])}.",
                note,
            )
            if part
        ),
        "",
        "| method | held-out points | mean abs error (calibrated) | uncalibrated | 50% coverage | 90% coverage |",
        "|---|---|---|---|---|---|",
    ]
    return lines + [
        f"| {r['method']} | {r['n']} | {r['mean_abs_rel_error']:.2%} | {r['mean_abs_rel_error_uncalibrated']:.2%} | "
        f"{r['coverage_50']:.0%} | {r['coverage_90']:.0%} |"
        for r in choice["table"]
    ]


# --------------------------------------------------------------------------- the law's interval beside the calibrated one (issue 43)

# A calibration's relative "inputs" are paths in this checkout (benchmarks/backtest_beyond.py writes them so).
REPO_ROOT = DEFAULT_PATH.parents[3]
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# calibrate_point's "status": why the calibrated interval is there, or why the law's own stands alone.
CALIBRATED = "calibrated"
BEYOND_RANGE = "beyond_calibrated_range"
NO_ENTRY = "no_calibration_entry"
NOT_BEYOND = "not_beyond_fitted_budgets"
NO_PREDICTION = "no_prediction"
NOT_CALIBRATED_WHY = {
    BEYOND_RANGE: "beyond the calibrated range",
    NO_ENTRY: "without a calibration entry",
    NOT_BEYOND: "not beyond the fitted budgets",
    NO_PREDICTION: "without a prediction",
}
# The numbers calibrate_point reads from every method's entry, and the least each may be.
_ENTRY_NUMBERS = {"shift0": None, "shift1": None, "sd0": 0.0, "sd1": 0.0, "q50": 0.0, "q90": 0.0, "max_factor": 1.0}


def shown_path(calibration: dict[str, Any]) -> str:
    """The calibration's file as output shows it (the committed one by its place in the repository)."""
    path = Path(calibration["path"])
    return "delphi/fits/data/beyond_calibration.json (committed)" if path.resolve() == DEFAULT_PATH else str(path)


def check_calibration_source(calibration: dict[str, Any], root: Path = REPO_ROOT) -> dict[str, Any]:
    """The data a calibration was made from, against the sha256 it records ("inputs": path -> sha256;
    a relative path is one in this checkout, `root`). DelphiError naming the file when the record is
    missing or not a sha256, or when that data is here with other bytes: the calibration no longer
    describes it. Data that is not here cannot be checked; the answer says so ("verified": False)."""
    where = calibration.get("path", "calibration")
    inputs = calibration.get("inputs")
    if not isinstance(inputs, dict) or not inputs:
        raise DelphiError(
            f"{where}: key 'inputs' = {inputs!r}, expected the sha256 of the data the calibration was "
            f"made from ({{path: sha256}})"
        )
    checked = []
    for name, recorded in inputs.items():
        if not isinstance(recorded, str) or not SHA256_HEX.fullmatch(recorded):
            raise DelphiError(f"{where}: key 'inputs' records {recorded!r} for {name}, not a sha256 (64 hex digits)")
        path = Path(name) if Path(name).is_absolute() else root / name
        try:
            actual = hashlib.sha256(path.read_bytes()).hexdigest()
        except FileNotFoundError:
            checked.append({"path": name, "sha256": recorded, "verified": False, "note": "not found here; not checked"})
            continue
        except OSError as e:
            raise DelphiError(
                f"{where}: cannot read its source data {path} to check its sha256 ({e.strerror or e})"
            ) from None
        if actual != recorded:
            raise DelphiError(
                f"{where}: source hash mismatch: made from {name} with sha256 {recorded[:12]}..., but {path} "
                f"has sha256 {actual[:12]}...; the calibration does not describe this data"
            )
        checked.append({"path": name, "sha256": recorded, "verified": True})
    return {"inputs": checked, "verified": all(c["verified"] for c in checked)}


def load_checked_calibration(path: str | Path | None = None, root: Path = REPO_ROOT) -> dict[str, Any]:
    """`load_calibration` (kind and schema_version checked), every method entry's numbers checked
    (finite; sds and quantiles >= 0, max_factor >= 1) and its source hash checked
    (`check_calibration_source`, kept as "source_check"): any failure is a DelphiError naming the
    file, before any fit."""
    calibration = load_calibration(path)
    where = calibration["path"]
    for method, entry in calibration["methods_parsed"].items():
        for name, least in _ENTRY_NUMBERS.items():
            value = getattr(entry, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or (least is not None and value < least)
            ):
                need = "a finite number" + ("" if least is None else f" >= {least:g}")
                raise DelphiError(f"{where}: methods.{method}.{name} = {value!r}, expected {need}")
    calibration["source_check"] = check_calibration_source(calibration, root)
    return calibration


def calibrate_point(
    method_key: str | None,
    predicted: float | None,
    interval_90: Sequence[float] | None,
    factor: float,
    calibration: dict[str, Any],
    *,
    fit_label: str | None = None,
) -> dict[str, Any]:
    """One prediction, `factor` times the largest fitted budget, beside its calibrated interval. Pure:
    the method's calibration entry (`method_key`, e.g. from `calibration_key`; None: no entry), the
    law's prediction and its own 90% interval (which sets the fit-only sd, `fit_only_sd_rel`).

    Always: "status", "applied", "method", "factor", "max_calibrated_factor" (None without an entry),
    "uncalibrated_loss", "uncalibrated_interval_90". Calibrated (status CALIBRATED): "loss" (the
    calibrated centre: the law's point less the calibrated shift), "loss_50", "loss_90", "sd_rel",
    "model_sd_rel", "shift_log", "base_sd_rel". Otherwise "reason", one line: a method without an
    entry (NO_ENTRY), a factor beyond the furthest calibrated one (BEYOND_RANGE: the calibration is not
    extrapolated; the law's own interval stands, uncalibrated), a prediction not beyond the fitted
    budgets (NOT_BEYOND: the calibration is of extrapolation) or no finite prediction (NO_PREDICTION)."""
    entry = calibration["methods_parsed"].get(method_key) if method_key is not None else None
    own = None if interval_90 is None or None in tuple(interval_90) else [float(v) for v in interval_90]
    out: dict[str, Any] = {
        "status": CALIBRATED,
        "applied": False,
        "method": method_key,
        "factor": float(factor),
        "max_calibrated_factor": None if entry is None else float(entry.max_factor),
        "uncalibrated_loss": None if predicted is None else float(predicted),
        "uncalibrated_interval_90": own,
    }
    label = fit_label or (repr(method_key) if method_key is not None else "this method")
    if entry is None:
        out.update(
            status=NO_ENTRY,
            reason=f"no calibration entry for {label} in {shown_path(calibration)}; its entries: "
            f"{', '.join(sorted(calibration['methods_parsed']))}",
        )
    elif predicted is None or not math.isfinite(float(predicted)) or float(predicted) <= 0:
        out.update(status=NO_PREDICTION, reason=f"no finite positive prediction to calibrate ({predicted!r})")
    elif not math.isfinite(float(factor)) or float(factor) <= 1:
        out.update(
            status=NOT_BEYOND,
            reason=f"{float(factor):.4g}x the largest fitted budget is not beyond it; "
            f"the calibration is of extrapolation",
        )
    elif float(factor) > entry.max_factor * (1 + 1e-9):
        out.update(
            status=BEYOND_RANGE,
            reason=f"{float(factor):.4g}x is beyond {method_key}'s furthest calibrated factor "
            f"(max_calibrated_factor {entry.max_factor:.4g}x)",
        )
    else:
        base = fit_only_sd_rel(float(predicted), own)
        p = entry.predict(float(predicted), float(factor), base)
        out.update(
            applied=True,
            loss=p["loss"],
            loss_50=p["loss_50"],
            loss_90=p["loss_90"],
            sd_rel=p["sd_rel"],
            model_sd_rel=p["model_sd_rel"],
            shift_log=p["shift_log"],
            base_sd_rel=base,
        )
    return out


def describe_calibrated(point: dict[str, Any]) -> str:
    """One phrase for a `calibrate_point` answer: the calibrated 90% interval with its centre, method and
    factor, or why there is none (the law's own interval then stands, uncalibrated)."""
    if point["applied"]:
        lo, hi = point["loss_90"]
        return (
            f"calibrated 90% [{lo:.4f}, {hi:.4f}] (centre {point['loss']:.4f}; {point['method']} calibration "
            f"at {point['factor']:.3g}x)"
        )
    return f"calibrated 90%: none; the law's own interval stands, uncalibrated: {point['reason']}"


def _with_truth(point: dict[str, Any], observed: float) -> dict[str, Any]:
    lo, hi = point["loss_90"] if point["applied"] else (None, None)
    return {**point, "covered_90": None if lo is None else bool(lo <= observed <= hi)}


def interval_coverage(points: Sequence[tuple[bool | None, dict[str, Any]]]) -> dict[str, Any]:
    """Counts over held-out points, each (the law's own interval covered it: True/False/None without an
    interval, its calibrated point with "covered_90"): how many there were, and how many each 90%
    interval (uncalibrated, calibrated) was there for and covered; the points left uncalibrated by why."""
    own = [c for c, _ in points if c is not None]
    cal = [p["covered_90"] for _, p in points if p["applied"]]
    why: dict[str, int] = {}
    for _, p in points:
        if not p["applied"]:
            why[p["status"]] = why.get(p["status"], 0) + 1
    return {
        "held_out": len(points),
        "uncalibrated_90": {"with_interval": len(own), "covered": int(sum(own))},
        "calibrated_90": {"with_interval": len(cal), "covered": int(sum(cal)), "not_calibrated": why},
    }


def describe_fit(kind: str, method: str) -> str:
    return f"the {kind} fit by {method}"


def calibrate_backtest(
    result: dict[str, Any], calibration: dict[str, Any], *, method: str, kind: str, fit_method: str
) -> dict[str, Any]:
    """A `delphi.fits.backtest.backtest` result with each held-out budget's calibrated interval beside
    the law's own ("calibrated": `calibrate_point` plus "covered_90"; "predicted_loss" stays the law's),
    the calibration's provenance ("calibration") and, per method (`method`, the --method name),
    `interval_coverage` ("interval_coverage")."""
    key = calibration_key(kind, fit_method)
    budgets = []
    for b in result["budgets"]:
        point = calibrate_point(
            key,
            b["predicted_loss"],
            b["loss_interval_90"],
            b["extrapolation"],
            calibration,
            fit_label=describe_fit(kind, fit_method),
        )
        budgets.append({**b, "calibrated": _with_truth(point, b["observed_best_loss"])})
    coverage = interval_coverage([(b["covered_90"], b["calibrated"]) for b in budgets])
    return {
        **result,
        "budgets": budgets,
        "calibration": _provenance(calibration, result.get("input_sha256")),
        "interval_coverage": {method: coverage},
    }


def calibrate_all_holdouts(
    result: dict[str, Any], calibration: dict[str, Any], fits: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    """A `delphi.fits.backtest.all_holdouts` result with every scored row's calibrated interval
    ("calibrated", as `calibrate_backtest`), the provenance and the per-method `interval_coverage`.
    `fits`: method name -> (kind, method) of its fits (a method whose every fit failed has no rows)."""
    rows, per_method = [], {}
    for r in result["rows"]:
        if "error" in r:
            rows.append(r)
            continue
        kind, fit_method = fits.get(r["method"], (r["method"], r["method"]))
        own = None if r["lo_90"] is None else [r["lo_90"], r["hi_90"]]
        point = calibrate_point(
            calibration_key(kind, fit_method),
            r["predicted_loss"],
            own,
            r["extrapolation"],
            calibration,
            fit_label=describe_fit(kind, fit_method),
        )
        row = {**r, "calibrated": _with_truth(point, r["observed_best_loss"])}
        rows.append(row)
        per_method.setdefault(r["method"], []).append((row["covered_90"], row["calibrated"]))
    coverage = {m: interval_coverage(per_method.get(m, [])) for m in dict.fromkeys(r["method"] for r in result["rows"])}
    return {
        **result,
        "rows": rows,
        "calibration": _provenance(calibration, result.get("input_sha256")),
        "interval_coverage": coverage,
    }


def _provenance(calibration: dict[str, Any], input_sha256: str | None) -> dict[str, Any]:
    """`calibration_provenance`, its source check, and whether the backtested table's file is the data
    the calibration was made from ("table_is_calibration_source": its calibrated coverage is then in-sample)."""
    out = calibration_provenance(calibration)
    if "source_check" in calibration:
        out["source_check"] = calibration["source_check"]
    recorded = (calibration.get("inputs") or {}).values() if isinstance(calibration.get("inputs"), dict) else ()
    out["table_is_calibration_source"] = input_sha256 is not None and input_sha256 in recorded
    return out
