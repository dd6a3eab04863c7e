"""A fit's diagnostics and its per-law extras as typed records, written to the fit JSON key for key.

Every field is optional: each law records the ones that describe it (docs/design.md §3.4). A record
keeps the JSON keys in the order the fit recorded them (`keys`), so that a fit written, read back
and written again has the same bytes: seals hash fit files. Keys this version does not know (a
file from a newer delphi) ride along in `other`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

# `bootstrap_draws_without_<name>`: bootstrap draws whose law implies no value of derived quantity <name>.
DRAWS_WITHOUT_PREFIX = "bootstrap_draws_without_"

Record = TypeVar("Record", bound="_KeyedRecord")


@dataclass(frozen=True)
class _KeyedRecord:
    """Typed fields named as their JSON keys, the keys in recorded order, and unknown keys."""

    keys: tuple[str, ...] = ()
    other: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def _field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls)) - {"keys", "other"}

    @classmethod
    def _split(cls, name: str, value: Any, typed: dict[str, Any], other: dict[str, Any]) -> None:
        """Put one JSON key's value into the typed fields or the unknown keys."""
        if name in cls._field_names():
            typed[name] = tuple(value) if isinstance(value, list) and name in _TUPLE_FIELDS else value
        else:
            other[name] = value

    @classmethod
    def from_mapping(cls: type[Record], values: Mapping[str, Any]) -> Record:
        """The record of a fit's JSON object (or of the dict a fitter builds), in its key order."""
        typed: dict[str, Any] = {}
        other: dict[str, Any] = {}
        for name, value in values.items():
            cls._split(str(name), value, typed, other)
        return cls(keys=tuple(str(k) for k in values), other=other, **typed)

    def _json_value(self, name: str) -> Any:
        return getattr(self, name) if name in self._field_names() else self.other[name]

    def to_json(self) -> dict[str, Any]:
        """The JSON object: every recorded key, in recorded order."""
        return {name: self._json_value(name) for name in self.keys}

    def merged(self: Record, values: Mapping[str, Any]) -> Record:
        """This record with `values` set: a key recorded before keeps its place, a new key goes last."""
        return type(self).from_mapping({**self.to_json(), **values})

    def without(self: Record, name: str) -> Record:
        """This record without key `name`."""
        return type(self).from_mapping({k: v for k, v in self.to_json().items() if k != name})

    def __contains__(self, name: str) -> bool:
        return name in self.keys


_TUPLE_FIELDS = frozenset({"at_bound"})


@dataclass(frozen=True)
class FitDiagnostics(_KeyedRecord):
    """How a fit went: its estimate, its points, its table, its residuals and its bootstrap."""

    # The estimate (FitResult.status follows from these).
    at_bound: tuple[str, ...] = ()  # parameters on a bound of their search region
    converged: bool | None = None
    # The points (delphi.fits.data.cell_points): runs, seed cells and the pooled seed noise.
    n_runs: int | None = None
    seed_noise_nats: float | None = None  # pooled within-cell std; None without replicates
    n_cells: int | None = None
    seeds_per_cell_max: int | None = None
    # The table (delphi.fits.data.provenance).
    source: str | None = None
    dropped: Mapping[str, int] | None = None
    budget_derived: bool | None = None
    query: str | None = None
    params_convention: str | None = None
    flops_family_origin: str | None = None
    table: Mapping[str, Any] | None = None  # delphi.fits.data.table_record
    # Residuals about the law.
    rss: float | None = None
    rmse_log: float | None = None
    max_abs_log_residual: float | None = None
    max_abs_rel_residual: float | None = None
    mean_abs_rel_error: float | None = None
    r2: float | None = None
    residual_std_nats: float | None = None  # per free-parameter dof: the predictive term of backtest intervals
    residual_sd_nats: float | None = None  # the curve law's residual sd of one eval
    r2_N: float | None = None  # isoFLOP laws: R^2 of N*(C), D*(C), L*(C) in log-log
    r2_D: float | None = None
    r2_L: float | None = None
    # The optimiser.
    objective_huber_sum: float | None = None
    huber_delta: float | None = None
    n_starts: int | None = None
    n_starts_at_best: int | None = None
    condition_number: float | None = None
    n_evaluations: int | None = None
    # isoFLOP and frontier laws.
    n_budgets: int | None = None
    n_budgets_skipped: int | None = None
    parabola_loss: str | None = None
    vertices_outside_sampled_range: int | None = None
    n_envelope_points: int | None = None
    interval: str | None = None  # how the reported intervals were made
    e_mode: str | None = None
    points: str | None = None
    weights: str | None = None
    vertex_sigma_nats: list[float] | None = None
    term: str | None = None  # the MoE law's expert term
    # The bootstrap (delphi.fits.bootstrap).
    bootstrap_n: int | None = None
    bootstrap_failed: int | None = None
    bootstrap_unit: str | None = None
    bootstrap_strata: str | None = None
    bootstrap_workers: int | None = None
    bootstrap_starts: str | None = None
    bootstrap_draws_without: Mapping[str, int] = field(default_factory=dict)  # derived quantity -> draws
    bootstrap: str | None = None  # the curve law's resampling: "runs" or "residuals"
    n_bootstrap: int | None = None  # the curve law's replicates

    @classmethod
    def _split(cls, name: str, value: Any, typed: dict[str, Any], other: dict[str, Any]) -> None:
        if name.startswith(DRAWS_WITHOUT_PREFIX):
            typed.setdefault("bootstrap_draws_without", {})[name[len(DRAWS_WITHOUT_PREFIX) :]] = value
        else:
            super()._split(name, value, typed, other)

    def _json_value(self, name: str) -> Any:
        if name.startswith(DRAWS_WITHOUT_PREFIX):
            return self.bootstrap_draws_without[name[len(DRAWS_WITHOUT_PREFIX) :]]
        return super()._json_value(name)


@dataclass(frozen=True)
class FitExtras(_KeyedRecord):
    """What a law records beside its parameters, at the fit JSON's top level (EXTRA_KEYS)."""

    optima: list[dict[str, Any]] | None = None  # isoFLOP: each budget's parabola vertex
    term: str | None = None  # the MoE law's expert term
    E_profile: dict[str, Any] | None = None  # frontier: the profile of the asymptote
    sensitivity: dict[str, Any] | None = None  # frontier: the prediction under other choices
    frontier_points: list[dict[str, Any]] | None = None
    skipped_budgets: list[dict[str, Any]] | None = None
    ols_intervals: dict[str, Any] | None = None
    e_mode: str | None = None
    curvature_law: dict[str, Any] | None = None  # isoFLOP: the parabolas' curvature, to price a run off N*
    E_prior: dict[str, Any] | None = None  # a lab's prior on E (delphi.fits.e_prior)


EXTRA_KEYS = tuple(f.name for f in dataclasses.fields(FitExtras) if f.name not in ("keys", "other"))
