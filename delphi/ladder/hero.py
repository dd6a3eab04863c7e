"""The hero config: the compute-optimal run at compute C from a fitted N*(C), D*(C).

The shape is the family member (spec.shape, widths searched over multiples of
shape.hero_width_multiple) whose active non-embedding N is closest in log to
the fit's N*(C); its tokens are C / exact FLOPs per token, so the hero spends
exactly C (within the spec's tolerance); batch and hyperparameters come from
the same transfer recipe as the ladder's rungs, the batch clipped to the top
budget's. `hero_ranges` compares the hero's tokens per parameter, steps, batch
and beta2 with the ladder's ranges (what the gates read).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from delphi.errors import DelphiError, quoted
from delphi.ladder.plan import Rung, hero_ranges, manifest_row, params_in_convention, plan_hero
from delphi.ladder.spec import LadderSpec

if TYPE_CHECKING:
    import pandas as pd


__all__ = ["hero_from_fit", "hero_ranges", "plan_hero"]


def hero_from_fit(
    fit_path: str | Path, compute: float, spec: LadderSpec, seed: int = 0, results: "pd.DataFrame | None" = None
) -> tuple[Rung, dict]:
    """(Rung, details) for the hero at `compute` FLOPs; `results` (the ladder's results DataFrame, or
    None for the spec's plan) gives the ranges the hero is sized into; details["ranges"] reports them."""
    from delphi.fits import load_fit

    if not (compute > 0 and math.isfinite(compute)):
        raise DelphiError(f"--compute: must be a positive number of FLOPs, got {quoted(compute)}")
    fit = load_fit(fit_path)
    prediction = fit.predict(compute=compute)
    n_star, d_star = prediction.get("params"), prediction.get("tokens")
    if n_star is None or not (float(n_star) > 0):
        raise DelphiError(f"--fit: {fit_path} ({getattr(fit, 'kind', '?')} fit) does not predict N*(C); use an isoflop, parametric or vpnls fit")
    # N* is counted the way the fit counted it (its FLOPs family says how; plain fits: non-embedding).
    convention = getattr(getattr(fit, "family", None), "convention", None) or "nonembedding"
    rung = plan_hero(spec, float(n_star), compute, seed, results=results, convention=convention)
    error = rung.flops / compute - 1
    if abs(error) > spec.tolerance:
        raise DelphiError(f"--compute: the hero reaches {rung.flops:.4g} FLOPs, {error:+.2%} from {compute:g} (tolerance {spec.tolerance:.0%})")
    row = manifest_row(rung)
    details = {
        "compute": compute,
        "predicted_params": float(n_star),
        "predicted_tokens": float(d_star) if d_star is not None else None,
        "predicted_loss": prediction.get("loss"),
        "predicted_loss_interval_90": prediction.get("loss_interval_90"),
        "params_convention": convention,
        "params_ratio_to_predicted": params_in_convention(rung.model, spec.seq_len, convention) / float(n_star),
        **{k: v for k, v in row.items() if k != "config"},
        "ranges": hero_ranges(spec, rung, results),
    }
    return rung, details
