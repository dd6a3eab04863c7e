"""What a seal is judged on, as types handed down from the one place that builds them.

`Evidence` names the sources (the fit, the results table and the runs and reports beside it);
`PredictionRule` says how the hero's sealed number is made from them; `SealTerms` what is sealed
beside it. `delphi prereg create` builds all three from its flags, the study's sealing stage from
the study; the prediction (`delphi.prereg.predict.hero_prediction`), the gates
(`delphi.prereg.measure.compute_gates`) and the seal (`delphi.prereg.create.create_prereg`) read them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delphi.fits.data import TableOptions
from delphi.fits.intervals import PointCorrection
from delphi.prereg.gates import GateThresholds

# docs/design.md §9: the project's goal is a hero within 1% of its prediction.
DEFAULT_TOLERANCE_REL = 0.01


@dataclass(frozen=True)
class Evidence:
    """The sources a seal is judged on.

    `fit_path` the primary fit (written by `delphi fit`); `results` the results table, read with
    `options` (column mapping, query; None: the defaults); `ladder` the ladder dir (its manifest,
    spec, run dirs and curves), None for a table from elsewhere; `curve_fit_path` a curve-law fit for
    the trajectory; `backtest` the primary law's held-out-budget backtest already measured (None:
    refitted); `rehearsal_run` the dress rehearsal's run dir and `rehearsal` its score already
    measured; `lr_calibration` `lr-calibrate` reports (gate lr_transfer); `probe_runs` finished
    runs beyond the ladder, sealed before they trained (gate probes, method_agreement's evidence);
    `recipe_check` a `delphi ladder recipe-check` report (gate recipe)."""

    fit_path: Path
    results: Path | None = None
    ladder: Path | None = None
    options: TableOptions | None = None
    curve_fit_path: Path | None = None
    backtest: dict | None = None
    rehearsal_run: Path | None = None
    rehearsal: dict | None = None
    lr_calibration: Sequence[Path] | None = None
    probe_runs: Sequence[Path] = ()
    recipe_check: Path | None = None


@dataclass(frozen=True)
class PredictionRule:
    """How the hero's sealed number is made from the evidence.

    `probe_correction`: the primary law x (1 + its error trend at the probes), carried to the hero
    by `probe_carry` (delphi.fits.probes.PROBE_CARRIES); `noise_scope` (NOISE_SCOPES): whose seed
    spread is one run's noise; `seeds` (two or more): the outcome is the mean of those seeds' runs
    of the hero config (None: one run); `point_correction` (delphi.fits.intervals.PointCorrection):
    the law x (1 + its measured bias on this design)."""

    probe_correction: bool = False
    probe_carry: str = "linear"
    noise_scope: str = "pooled"
    seeds: Sequence[int] | None = None
    point_correction: PointCorrection | None = None

    @property
    def n_seeds(self) -> int:
        """How many runs' mean the outcome is (1 without a seed list)."""
        return len(self.seeds) if self.seeds else 1


@dataclass(frozen=True)
class SealTerms:
    """What is sealed beside the prediction, and how the gates decide whether it may be.

    `tolerance_rel` the decision's tolerance (it overrides `thresholds.tolerance_rel`);
    `thresholds` the gates' (None: their defaults at `tolerance_rel`); `force` seals over failing
    gates, `forced_gates` ({gate: reason}) over those gates alone, each reason sealed; `author`
    (None: the user), `rationale` and `assumptions` are sealed as given; `trajectory_from_probes`
    takes the trajectory's shape from the longest probe instead of the curve law, fitted with
    `curve_bootstrap` replicates and `curve_seed`; `competing(hero, final)` returns the other laws'
    predictions sealed beside the primary."""

    tolerance_rel: float = DEFAULT_TOLERANCE_REL
    thresholds: GateThresholds | None = None
    force: bool = False
    forced_gates: Mapping[str, str] | None = None
    author: str | None = None
    rationale: str = ""
    assumptions: Sequence[str] | None = None
    trajectory_from_probes: bool = False
    curve_bootstrap: int = 200
    curve_seed: int = 0
    competing: Callable[[Any, dict], dict[str, dict]] | None = None
