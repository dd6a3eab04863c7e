"""The results object every fit returns, its JSON form, and `load_fit`.

A `FitResult` holds the point estimate (`params`), 90% intervals, residual
diagnostics, provenance (input sha256, number of points, seed, toolkit
version) and, when bootstrapped, the bootstrap draws of the parameters. The
draws make every prediction carry a percentile interval, also after the fit
was written to JSON and read back with `load_fit`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

import delphi
from delphi.errors import DelphiError, quoted
from delphi.fits.allocation import FlopsFamily
from delphi.fits.diagnostics import EXTRA_KEYS, FitDiagnostics, FitExtras
from delphi.fits.e_prior import EPrior
from delphi.fits.laws import (
    DEFAULT_TERM,
    ND_KINDS,
    SURFACES,
    LawKind,
    Surface,
    derived_quantities,
    off_optimum_penalty,
    surface_class,
)
from delphi.io import read_json

ALLOCATION_FITTED = "fitted in C"  # the `allocation` of a law in C: N*(C), D*(C) fitted, not allocated
INTERVAL_LEVELS = (0.5, 0.9)  # central percentile intervals reported on predictions
SCHEMA = "delphi.fit/1"
MODEL_FAMILIES = ("dense", "moe")


class FitStatus(StrEnum):
    """Whether the estimate can be trusted as an optimum. A str enum: FitStatus.OK == "ok", and the
    fit JSON's "status" stays the plain string. The report and the fit_status gate read it."""

    OK = "ok"  # an interior optimum
    AT_BOUND = "at_bound"  # a parameter on a bound of its search region (e.g. E = 0: no level-off)
    NOT_CONVERGED = "not_converged"  # the optimiser did not report convergence


FIT_STATUSES = tuple(s.value for s in FitStatus)


def fit_status(converged: bool, at_bound: list[str]) -> FitStatus:
    if not converged:
        return FitStatus.NOT_CONVERGED
    return FitStatus.AT_BOUND if at_bound else FitStatus.OK


@runtime_checkable
class FitLike(Protocol):
    """What every fitted law offers its readers (report, gates, CLI): FitResult and CurveLawFit."""

    @property
    def kind(self) -> str: ...

    @property
    def params(self) -> dict[str, float]: ...  # point estimate

    @property
    def intervals(self) -> Mapping[str, tuple[float, float]]: ...  # 90%, per parameter that has one

    @property
    def diagnostics(self) -> FitDiagnostics: ...  # .at_bound: names of parameters on a bound

    @property
    def status(self) -> FitStatus: ...

    def summary(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass
class FitResult:
    kind: LawKind | str  # a LawKind; a kind this version does not know (a newer file) stays a str
    method: str  # approach3 | vpnls | approach2 | approach1 | frontier-free | ...
    params: dict[str, float]
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # 90%
    # Typed records (a mapping of their JSON keys is converted): how the fit went, and what the law
    # records beside its parameters (per-budget optima, E profile, ...).
    diagnostics: FitDiagnostics = field(default_factory=FitDiagnostics)
    extra: FitExtras = field(default_factory=FitExtras)
    input_sha256: str | None = None
    n_points: int = 0
    seed: int | None = None
    version: str = delphi.__version__
    samples: dict[str, list[float]] | None = None  # bootstrap draws, one list per parameter
    family: FlopsFamily | None = None  # exact FLOPs per token of the fitted models; None: C = 6 N D
    status: FitStatus = FitStatus.OK  # names of parameters on a bound in diagnostics.at_bound
    model_family: str | None = None  # "dense" | "moe" from the table's expert counts; None: not said
    # (smallest, largest) compute budget of the fitted rows, FLOPs: how far a prediction extrapolates
    fitted_compute: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.diagnostics, Mapping):
            self.diagnostics = FitDiagnostics.from_mapping(self.diagnostics)
        if isinstance(self.extra, Mapping):
            self.extra = FitExtras.from_mapping(self.extra)
        if self.status not in FIT_STATUSES:
            raise DelphiError(f"fit status {quoted(self.status)}: expected one of {FIT_STATUSES}")
        self.status = FitStatus(self.status)
        if self.kind in SURFACES:
            self.kind = LawKind(self.kind)
        if self.model_family is not None and self.model_family not in MODEL_FAMILIES:
            raise DelphiError(f"model family {quoted(self.model_family)}: expected one of {MODEL_FAMILIES}")

    @property
    def derived(self) -> dict[str, float]:
        return derived_quantities(self.kind, self.params)

    @property
    def law_in_nd(self) -> bool:
        """A law in (N, D) (predicts a run from its own N and D); else a law in compute alone."""
        return self.kind in ND_KINDS

    @property
    def term(self) -> str:
        """The MoE law's expert term (the keyword its X is passed as)."""
        return self.extra.term if "term" in self.extra else DEFAULT_TERM

    @property
    def law_terms(self) -> tuple[str, ...]:
        """Keywords the law reads besides N and D: (term,) for the MoE law, () for the others."""
        law = SURFACES.get(self.kind)
        return (self.term,) if law is not None and law.has_expert_term else ()

    @property
    def surface(self) -> Surface:
        """The law at the point estimate (DelphiError for a kind this version does not know)."""
        return surface_class(self.kind).from_params(self.params, self.term)

    @property
    def allocation(self) -> str:
        """How compute is split into N and D: under the family's exact FLOPs, or 6 N D; a law in C
        (isoFLOP, frontier) allocates nothing: its N*(C) and D*(C) are fitted to the vertices."""
        if not self.law_in_nd:
            return ALLOCATION_FITTED
        return "exact" if self.family is not None else "6ND"

    def with_family(self, family: FlopsFamily | None) -> "FitResult":
        return dataclasses.replace(self, family=family)

    def predict(self, compute: Any = None, params: Any = None, tokens: Any = None, **terms: Any) -> dict[str, Any]:
        """Predict at compute C (loss, N*, D*, tokens per parameter) or at (N, D).

        With bootstrap draws, each quantity `q` also gets `q_interval_50` and `q_interval_90`.
        This is the one prediction entry point (plot, prereg, hero and backtests call it); for
        laws in (N, D), compute=C is allocated under the fit's FLOPs family (exact) when it has
        one, else 6 N D; "allocation" says which.
        """
        query = {"compute": compute, "params": params, "tokens": tokens, **terms}
        if compute is not None:
            c = np.asarray(compute, float)
            if not (np.all(np.isfinite(c)) and np.all(c > 0)):
                raise DelphiError(f"predict: compute must be a positive finite number of FLOPs, got {quoted(compute)}")
        if compute is None and (params is None or tokens is None):
            raise DelphiError("predict: give compute=C, or params=N and tokens=D")
        law = surface_class(self.kind)
        family = self.family if law.in_nd else None
        point = law.from_params(self.params, self.term).predict_point(family=family, **query)
        out: dict[str, Any] = {"compute": compute} if compute is not None else {}
        out.update({k: to_plain(v) for k, v in point.items()})
        if compute is not None and point["params"] is not None:
            with np.errstate(invalid="ignore"):
                out["tokens_per_param"] = to_plain(point["tokens"] / point["params"])
        if compute is not None:
            out["allocation"] = self.allocation
        if self.samples:
            if family is not None and compute is not None:
                draws = self._allocated_draws(law, compute, family, terms)
            else:
                draws = [
                    law.from_params(p, self.term).predict_point(family=family, **query)
                    for p in _sample_dicts(self.samples)
                ]
            for key, value in point.items():
                if value is None:
                    continue
                values = np.array([d[key] for d in draws], dtype=float)
                if key == "params" and compute is None or key == "tokens" and compute is None:
                    continue  # inputs, not predictions
                for level in INTERVAL_LEVELS:
                    out[f"{key}_interval_{int(level * 100)}"] = _percentile_interval(values, level)
            if compute is not None and point["params"] is not None:
                with np.errstate(invalid="ignore"):
                    ratio = np.array([d["tokens"] / d["params"] for d in draws], dtype=float)
                for level in INTERVAL_LEVELS:
                    out[f"tokens_per_param_interval_{int(level * 100)}"] = _percentile_interval(ratio, level)
        return out

    def _allocated_draws(
        self, law: type[Surface], compute: Any, family: FlopsFamily, terms: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """Every bootstrap draw's exact-FLOP optimum in one vectorised allocation."""
        draws = {k: np.asarray(v, float) for k, v in self.samples.items()}
        opt = law.optimum_draws(draws, compute, family, self.term, **terms)
        n_draws = len(next(iter(draws.values())))
        return [{k: opt[k][i] for k in ("loss", "params", "tokens")} for i in range(n_draws)]

    def predict_run(self, *, params: Any, tokens: Any, flops: Any, **terms: Any) -> dict[str, Any]:
        """The loss of a concrete run (N, D, its exact FLOPs C): a law in (N, D) is evaluated at the
        run's own N and D; a law in C only (isoflop, envelope, frontier) at its FLOPs. Adds "how".

        This is what plot (residuals), prereg (the hero's final loss) and any other "what will this
        run reach" question call, so that none of them dispatches on the fit kind itself.
        """
        if self.law_in_nd:
            out = self.predict(params=params, tokens=tokens, **{k: v for k, v in terms.items() if k in self.law_terms})
            out["how"] = f"{self.kind} fit at the run's N and D"
            return out
        out = self.predict(compute=flops)
        out["how"] = f"{self.kind} fit at the run's exact compute C"
        curvature = self.extra.curvature_law
        if curvature and out.get("params") is not None and params is not None:
            # An isoFLOP law knows the optimum at C; its parabolas' curvature prices a run off it.
            # Runs may be one or an array (the residual figure predicts every rung at once).
            penalty = off_optimum_penalty(curvature, flops, params, np.asarray(out["params"], float))
            shift = lambda v: None if v is None else to_plain(np.asarray(v, float) + penalty)  # noqa: E731
            out["loss"] = shift(out["loss"])
            for key in [k for k in out if k.startswith("loss_interval_")]:
                out[key] = [shift(v) for v in out[key]]
            out["off_optimum_penalty"] = to_plain(penalty)
            if np.ndim(penalty) == 0:
                out["how"] += (
                    f", plus the isoFLOP curvature's penalty {float(penalty):.4f} nats for N = "
                    f"{float(params) / float(out['params']):.2f} x N*"
                )
            else:
                out["how"] += ", plus the isoFLOP curvature's penalty for each run's N / N*"
        return out

    def summary(self) -> str:
        lines = [f"{self.kind} fit ({self.method}), {self.n_points} points"]
        if self.status == FitStatus.AT_BOUND:
            names = ", ".join(self.diagnostics.at_bound) or "?"
            lines.append(
                f"  WARNING: parameter(s) on a bound of the search: {names}; the estimate is not an interior optimum"
            )
        elif self.status == FitStatus.NOT_CONVERGED:
            lines.append("  WARNING: the optimiser did not report convergence; treat the estimate with care")
        if self.law_in_nd:
            lines.append(
                f"  allocation: {'exact FLOPs (' + self.family.source + ')' if self.family else '6ND (no FLOPs family)'}"
            )
        for name, value in self.params.items():
            lo_hi = self.intervals.get(name)
            ci = f"  90% [{lo_hi[0]:.6g}, {lo_hi[1]:.6g}]" if lo_hi else ""
            lines.append(f"  {name:>14} = {value:.6g}{ci}")
        for name, value in self.derived.items():
            lo_hi = self.intervals.get(name)
            ci = f"  90% [{lo_hi[0]:.6g}, {lo_hi[1]:.6g}]" if lo_hi else ""
            lines.append(f"  {name:>14} = {value:.6g}{ci}  (derived)")
        for name, value in self.diagnostics.to_json().items():
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                lines.append(f"  {name}: {value:.6g}" if isinstance(value, float) else f"  {name}: {value}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return to_plain(
            {
                "schema": SCHEMA,
                "kind": self.kind,
                "method": self.method,
                "status": self.status,
                "family": self.model_family,
                "allocation": self.allocation,
                "flops_family": None if self.family is None else self.family.to_json(),
                "params": self.params,
                "derived": self.derived,
                "intervals": {k: list(v) for k, v in self.intervals.items()},
                "diagnostics": self.diagnostics.to_json(),
                **self.extra.to_json(),
                "input_sha256": self.input_sha256,
                "n_points": self.n_points,
                "seed": self.seed,
                "version": self.version,
                "bootstrap": None
                if self.samples is None
                else {"n": len(next(iter(self.samples.values()))), "samples": self.samples},
                "fitted_compute": None if self.fitted_compute is None else list(self.fitted_compute),
            }
        )


# What each law's parameters may be, as its fitters bound them: coefficients and the asymptote are
# >= 0 (NNLS / bounded searches), exponents > 0 (EXPONENT_BOUNDS, GAMMA_GRID). The isoFLOP laws'
# exponents and log10 prefactors may take either sign here: a ladder too small to have interior
# optima really fits a < 0, and its gates, not its loading, refuse it (`delphi predict` refuses to
# size from it, ISOFLOP_SIZING_SIGNS). A fit file breaking these was not written by a fit (or was
# edited): it would predict nonsense (loss=None) instead of failing.
NONNEGATIVE, POSITIVE = ">= 0", "> 0"
PARAM_SIGNS: dict[str, dict[str, str]] = {
    LawKind.PARAMETRIC: {"E": NONNEGATIVE, "A": NONNEGATIVE, "B": NONNEGATIVE, "alpha": POSITIVE, "beta": POSITIVE},
    LawKind.MOE: {
        "E": NONNEGATIVE,
        "G": NONNEGATIVE,
        "A": NONNEGATIVE,
        "B": NONNEGATIVE,
        "alpha": POSITIVE,
        "beta": POSITIVE,
        "gamma": POSITIVE,
    },
    LawKind.FRONTIER: {"E": NONNEGATIVE, "A": NONNEGATIVE, "gamma": POSITIVE},
}
# N* ~ C^a and D* ~ C^b: a model and its data grow with compute (every committed fit has 0.3-0.7).
ISOFLOP_SIZING_SIGNS = {
    LawKind.ISOFLOP: {"a": POSITIVE, "b": POSITIVE},
    LawKind.ENVELOPE: {"a": POSITIVE, "b": POSITIVE},
}


def check_sizing_exponents(fit: "FitResult", where: str) -> None:
    """DelphiError unless an isoFLOP law's allocation exponents are positive (before it sizes a run)."""
    for name, sign in ISOFLOP_SIZING_SIGNS.get(fit.kind, {}).items():
        value = fit.params.get(name)
        if isinstance(value, (int, float)) and not value > 0:
            raise DelphiError(
                f"{where}: params.{name} = {quoted(value)}, expected {sign} for a {fit.kind} fit "
                "(N* and D* must grow with compute; refit on budgets with interior optima)"
            )


def _real(value: Any, key: str, where: str, *, missing_ok: bool = False) -> float:
    """A JSON number (not a bool, not text): finite, or NaN where `missing_ok` and it is null."""
    if value is None and missing_ok:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DelphiError(f"{where}: {key} = {quoted(value)}, expected a number")
    if not math.isfinite(value):
        if missing_ok:
            return math.nan
        raise DelphiError(f"{where}: {key} = {quoted(value)}, expected a finite number")
    return float(value)


def _mapping(value: Any, key: str, where: str) -> dict:
    if not isinstance(value, dict):
        raise DelphiError(f"{where}: {key} = {quoted(value)}, expected a JSON object")
    return value


def _fit_params(data: dict[str, Any], kind: Any, where: str) -> dict[str, float]:
    """The fit's parameters: numbers, finite, every one the law needs, of the sign its fitter allows."""
    raw = _mapping(data["params"], "params", where)
    params = {str(k): _real(v, f"params.{k}", where) for k, v in raw.items()}
    surface = SURFACES.get(kind)
    if surface is not None:
        missing = [name for name in surface.param_names if name not in params]
        if missing:
            raise DelphiError(
                f"{where}: params.{missing[0]} is missing; a {kind} fit has {', '.join(surface.param_names)}"
            )
    for name, sign in PARAM_SIGNS.get(kind, {}).items():
        value = params[name]
        if not (value >= 0 if sign == NONNEGATIVE else value > 0):
            raise DelphiError(f"{where}: params.{name} = {quoted(value)}, expected {sign} for a {kind} fit")
    return params


def fit_from_json(data: dict[str, Any], where: str = "fit") -> FitResult:
    """A FitResult from its JSON; every field it reads is checked first (DelphiError naming the key)."""
    for key in ("kind", "method", "params"):
        if key not in data:
            raise DelphiError(f"{where}: missing key {quoted(key)}; not a delphi fit file")
    for key in ("kind", "method"):
        if not isinstance(data[key], str):
            raise DelphiError(f"{where}: {key} = {quoted(data[key])}, expected a string")
    params = _fit_params(data, data["kind"], where)
    intervals = {}
    for name, pair in _mapping(data.get("intervals") or {}, "intervals", where).items():
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise DelphiError(f"{where}: intervals.{name} = {quoted(pair)}, expected [low, high]")
        intervals[str(name)] = tuple(_real(v, f"intervals.{name}", where, missing_ok=True) for v in pair)
    boot = data.get("bootstrap")
    if boot and not (isinstance(boot, dict) and isinstance(boot.get("samples"), dict)):
        raise DelphiError(
            f"{where}: 'bootstrap' is not a fit's bootstrap (expected {{n, samples}}); "
            f"a {quoted(data.get('kind'))} file is not a fit written by `delphi fit`"
        )
    samples = None
    if boot:
        samples = {}
        for name, draws in boot["samples"].items():
            if not isinstance(draws, list):
                raise DelphiError(f"{where}: bootstrap.samples.{name} = {quoted(draws)}, expected a list of numbers")
            # a refit that failed left null (NaN) draws: they are skipped by the intervals
            samples[str(name)] = [_real(v, f"bootstrap.samples.{name}", where, missing_ok=True) for v in draws]
        if len({len(v) for v in samples.values()}) > 1:
            raise DelphiError(f"{where}: bootstrap.samples: the parameters have different numbers of draws")
    curvature = data.get("curvature_law")
    if curvature is not None:
        for key in ("log10_K0", "exponent"):
            _real(_mapping(curvature, "curvature_law", where).get(key), f"curvature_law.{key}", where)
    if data.get("E_prior") is not None:  # a lab's prior on E (delphi.fits.e_prior): checked as the fit reads it
        EPrior.from_json(data["E_prior"], f"{where}: E_prior")
    n_points = data.get("n_points", 0)
    if isinstance(n_points, bool) or not isinstance(n_points, int) or n_points < 0:
        raise DelphiError(f"{where}: n_points = {quoted(n_points)}, expected an integer >= 0")
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise DelphiError(f"{where}: seed = {quoted(seed)}, expected an integer or null")
    try:
        return _fit_result(data, where, params, intervals, samples, n_points, seed)
    except DelphiError as e:
        raise DelphiError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None


def _fit_result(
    data: dict[str, Any],
    where: str,
    params: dict[str, float],
    intervals: dict,
    samples: dict | None,
    n_points: int,
    seed: int | None,
) -> FitResult:
    return FitResult(
        kind=data["kind"],
        method=data["method"],
        params=params,
        intervals=intervals,
        diagnostics=FitDiagnostics.from_mapping(_mapping(data.get("diagnostics") or {}, "diagnostics", where)),
        extra=FitExtras.from_mapping({k: data[k] for k in EXTRA_KEYS if k in data}),
        input_sha256=data.get("input_sha256"),
        n_points=n_points,
        seed=seed,
        version=data.get("version", "unknown"),
        samples=samples,
        family=None
        if not data.get("flops_family")
        else FlopsFamily.from_json(data["flops_family"], f"{where}: flops_family"),
        status=data.get("status") or FitStatus.OK,
        model_family=data.get("family") if data.get("family") in MODEL_FAMILIES else None,
        fitted_compute=_fitted_compute(data),
    )


def _fitted_compute(data: dict[str, Any]) -> tuple[float, float] | None:
    """The fit's compute range: its own record, else (a file without one) the per-budget optima's or
    frontier points' FLOPs; None when the file says neither (or says it wrongly)."""
    recorded = data.get("fitted_compute")
    if recorded is None:
        points = data.get("optima") or data.get("frontier_points") or []
        recorded = [p.get("flops") for p in points if isinstance(p, dict)] if isinstance(points, list) else []
        recorded = (
            [min(recorded), max(recorded)] if recorded and all(isinstance(c, (int, float)) for c in recorded) else None
        )
    try:
        low, high = (float(c) for c in recorded)
    except (TypeError, ValueError):
        return None
    return (low, high) if 0 < low <= high < float("inf") else None


def table_context(table: Any) -> dict[str, Any]:
    """FitResult fields that come from the table: the FLOPs family, the model family and the
    compute range fitted (nominal budgets where the table has them, else exact FLOPs)."""
    column = "budget" if "budget" in table else "flops" if "flops" in table else None
    compute = np.asarray(table[column], float) if column is not None and len(table) else np.empty(0)
    compute = compute[np.isfinite(compute) & (compute > 0)]
    return {
        "family": table.attrs.get("flops_family"),
        "model_family": table.attrs.get("model_family"),
        "fitted_compute": (float(compute.min()), float(compute.max())) if compute.size else None,
    }


def load_fit(path: str | os.PathLike) -> FitResult:
    """Rebuild a results object from the JSON that `delphi fit ... --out` wrote."""
    path = Path(path)
    data = read_json(path, what="fit JSON")
    if not isinstance(data, dict):
        raise DelphiError(f"{path}: expected a JSON object")
    return fit_from_json(data, str(path))


def percentile_intervals(samples: dict[str, list[float]], level: float = 0.9) -> dict[str, tuple[float, float]]:
    return {k: _percentile_interval(np.asarray(v, float), level) for k, v in samples.items()}


def _percentile_interval(values: np.ndarray, level: float) -> tuple[Any, Any]:
    """Central interval over the draws (axis 0); per element when each draw is an array."""
    if values.ndim > 1:
        tail = 100 * (1 - level) / 2
        finite = np.where(np.isfinite(values), values, np.nan)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns give NaN
            lo, hi = np.nanpercentile(finite, [tail, 100 - tail], axis=0)
        return (lo, hi)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return (math.nan, math.nan)
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return (float(lo), float(hi))


def _sample_dicts(samples: dict[str, list[float]]) -> list[dict[str, float]]:
    keys = list(samples)
    return [dict(zip(keys, row)) for row in zip(*(samples[k] for k in keys))]


def to_plain(obj: Any) -> Any:
    """JSON-able copy: numpy scalars/arrays to Python, enums to their values, NaN/inf to None."""
    if isinstance(obj, enum.Enum):
        return to_plain(obj.value)
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_plain(obj.tolist()) if obj.ndim else to_plain(obj.item())
    if isinstance(obj, np.generic):
        return to_plain(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
