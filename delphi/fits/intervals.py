"""Predictive intervals: the normal quantiles of the central 50% and 90% intervals, and a fit's
bootstrap interval widened in quadrature by z x a scatter (`predictive_interval`).

Owned here so that every module that widens an interval (the backtest, the probes' correction, a
trajectory from a run's shape, the calibration) imports it from one place below them all. Also a
design's measured bias sealed as a correction of the point (`PointCorrection`, `correct_by_design`),
which a study file names (hero.point_correction) and a seal applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Z_90 = 1.6448536269514722  # standard normal quantile at 0.95: a central 90% interval
Z_50 = 0.6744897501960817  # ... at 0.75: a central 50% interval


def predictive_interval(
    point: float, fit_interval: Any, scatter: float | None, z: float = Z_90
) -> tuple[float, float] | None:
    """Bootstrap interval widened by z x the residual scatter, each side in quadrature (normal
    approx); z = Z_90 for a central 90% interval."""
    extra = z * scatter if scatter is not None else 0.0
    if fit_interval is not None and fit_interval[0] is not None and fit_interval[1] is not None:
        lo, hi = point - float(fit_interval[0]), float(fit_interval[1]) - point
    elif scatter is not None:
        lo = hi = 0.0
    else:
        return None
    return (point - float(np.hypot(max(lo, 0.0), extra)), point + float(np.hypot(max(hi, 0.0), extra)))


@dataclass(frozen=True)
class PointCorrection:
    """A bias of a study design's primary law at its hero, measured on earlier studies of the same
    design: the sealed point is the law's x (1 + rel), its intervals moved with it and widened in
    quadrature by z x sd_rel (`correct_by_design`)."""

    rel: float  # the measured mean relative error of the law at the hero (actual / law - 1)
    sd_rel: float  # that mean's standard error: the correction's own uncertainty
    source: str  # where it was measured (a sentence, sealed)


def correct_by_design(final: dict[str, Any], correction: PointCorrection) -> dict[str, Any]:
    """A seal's `final` prediction x (1 + correction.rel), its 50% and 90% intervals moved with it and
    widened, each side in quadrature, by z x correction.sd_rel of the corrected point. The law's
    own numbers stay beside it (`uncorrected`). The default study's correction is in
    delphi/defaults/default_study.yaml, with its source."""
    rel, sd_rel = float(correction.rel), float(correction.sd_rel)
    loss = float(final["loss"]) * (1 + rel)
    out = dict(final) | {"loss": loss}
    for key, z in (("loss_50", Z_50), ("loss_90", Z_90)):
        moved = None if final.get(key) is None else [float(v) * (1 + rel) for v in final[key]]
        widened = predictive_interval(loss, moved, sd_rel * loss, z) if moved is not None else None
        out[key] = None if widened is None else list(widened)
    out["uncorrected"] = {k: final.get(k) for k in ("loss", "loss_50", "loss_90", "source")}
    out["point_correction"] = {
        "rel": rel,
        "sd_rel": sd_rel,
        "source": correction.source,
        "rule": "the primary law's point x (1 + rel): the design's measured bias at its hero",
    }
    out["source"] = f"{final['source']}; x (1 {rel:+.2%}), this design's measured bias (hero.point_correction)"
    out["interval"] = (
        f"{final.get('interval') or 'the fit interval'}; moved by the correction and widened in quadrature "
        f"by z x {sd_rel:.2%} of the loss, the measured bias's standard error"
    )
    return out
