"""The hero config: the compute-optimal run at compute C from a fitted N*(C), D*(C).

The shape is the family member (spec.shape, widths searched over multiples of
shape.hero_width_multiple) whose active non-embedding N is closest in log to
the fit's N*(C); its tokens are C / exact FLOPs per token, so the hero spends
exactly C (within the spec's tolerance); batch and hyperparameters come from
the same transfer recipe as the ladder's rungs.
"""

from __future__ import annotations

import math
from pathlib import Path

from delphi.errors import DelphiError
from delphi.ladder.plan import manifest_row, plan_hero
from delphi.ladder.spec import LadderSpec


def hero_from_fit(fit_path: str | Path, compute: float, spec: LadderSpec, seed: int = 0) -> tuple[object, dict]:
    """(Rung, details) for the hero at `compute` FLOPs."""
    from delphi.fits import load_fit

    if not (compute > 0 and math.isfinite(compute)):
        raise DelphiError(f"--compute: must be a positive number of FLOPs, got {compute!r}")
    fit = load_fit(fit_path)
    prediction = fit.predict(compute=compute)
    n_star, d_star = prediction.get("params"), prediction.get("tokens")
    if n_star is None or not (float(n_star) > 0):
        raise DelphiError(f"--fit: {fit_path} ({getattr(fit, 'kind', '?')} fit) does not predict N*(C); use an isoflop, parametric or vpnls fit")
    rung = plan_hero(spec, float(n_star), compute, seed)
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
        "params_ratio_to_predicted": row["params"] / float(n_star),
        **{k: v for k, v in row.items() if k != "config"},
    }
    return rung, details
