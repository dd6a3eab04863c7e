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
from delphi.fits import load_fit
from delphi.fits.data import ANCHOR_ROLE, isoflop_rows
from delphi.fits.isoflop import near_optimum_cells
from delphi.ladder.family import params_in_convention
from delphi.ladder.manifest import manifest_row
from delphi.ladder.plan import (
    Rung,
    batch_for_tokens,
    expected_optimum,
    format_budget,
    make_rung,
    plan_ladder,
    rung_role,
    rung_tokens,
    shape_for_width,
)
from delphi.ladder.spec import LadderSpec
from delphi.model.config import ModelConfig
from delphi.model.flops import count_params
from delphi.train.config import TrainConfig

if TYPE_CHECKING:
    import pandas as pd


__all__ = ["hero_from_fit", "hero_ranges", "plan_hero"]


# ---- the hero against the ladder's ranges, sized ------------------------------------------------

# What the hero is compared against: its training length and data per parameter against every rung
# the ladder trained; its batch and beta2 against the top budget's (no discontinuity where the
# extrapolation starts).
RANGE_SCOPES = {"tokens_per_param": "ladder", "steps": "ladder", "batch_tokens": "top budget", "beta2": "top budget"}


def _ladder_rows(spec: LadderSpec, results: "pd.DataFrame | None" = None) -> list[dict[str, float | str]]:
    """(budget, tokens_per_param, steps, batch_size, batch_tokens, beta2, role) of the ladder's rungs:
    from the results table's completed rows when given, else from the plan."""
    keys = ("budget", "tokens_per_param", "steps", "batch_size", "batch_tokens", "beta2")
    if results is None:
        return [
            {**{k: float(manifest_row(r)[k]) for k in keys}, "role": rung_role(r.run_id)} for r in plan_ladder(spec)
        ]
    frame = results
    if "status" in frame.columns:
        frame = frame[frame["status"] == "completed"]
    missing = [k for k in keys if k not in frame.columns]
    if missing:
        raise DelphiError(f"results: a ladder table needs columns {', '.join(missing)} to compare the hero with")
    if len(frame) == 0:
        raise DelphiError("results: no completed rung to compare the hero with")
    return [
        {**{k: float(row[k]) for k in keys}, "role": str(row.get("role", "isoflop"))} for _, row in frame.iterrows()
    ]


def _top_budget(rows: list[dict[str, float | str]]) -> float:
    """The top budget of the isoFLOP sets (anchor rungs train on more, outside them)."""
    return max(float(r["budget"]) for r in rows if r["role"] != ANCHOR_ROLE)


def _trained(rows: list[dict[str, float | str]]) -> dict[str, tuple[float, float]]:
    top = _top_budget(rows)
    out = {}
    for key, scope in RANGE_SCOPES.items():
        values = [float(r[key]) for r in rows if scope == "ladder" or r["budget"] == top]
        out[key] = (min(values), max(values))
    return out


def trained_ranges(spec: LadderSpec, results: "pd.DataFrame | None" = None) -> dict[str, tuple[float, float]]:
    """[min, max] of each quantity of RANGE_SCOPES over its scope, as the rungs trained them (anchor
    rungs count for the ladder's steps and tokens per parameter; the top budget is the isoFLOP sets')."""
    return _trained(_ladder_rows(spec, results))


def range_scopes(spec: LadderSpec) -> dict[str, str]:
    """Which range `ladder_ranges` judges each quantity against: RANGE_SCOPES, or "recipe caps" for
    batch and beta2 under a recipe."""
    recipe_keys = ("batch_tokens", "beta2") if spec.recipe is not None else ()
    return {key: "recipe caps" if key in recipe_keys else scope for key, scope in RANGE_SCOPES.items()}


def ladder_ranges(spec: LadderSpec, results: "pd.DataFrame | None" = None) -> dict[str, tuple[float, float]]:
    """The ranges a hero is judged against: `trained_ranges`, with batch and beta2 bounded by the
    recipe's caps under a recipe (`range_scopes`)."""
    return _judged(spec, _ladder_rows(spec, results))


def _judged(spec: LadderSpec, rows: list[dict[str, float | str]]) -> dict[str, tuple[float, float]]:
    out = _trained(rows)
    if spec.recipe is not None:
        # Under a recipe batch and beta2 follow the run's tokens by the one rule, which the hero
        # continues; what bounds them is the rule's caps (the recipe check sweeps the batch there).
        r = spec.recipe
        out["batch_tokens"] = (min(float(row["batch_tokens"]) for row in rows), float(r.max_seqs * spec.seq_len))
        out["beta2"] = (r.beta2_min.value, r.beta2_max.value)
    return out


def _hero_values(hero: "Rung | TrainConfig") -> dict[str, float]:
    """The compared quantities of a hero given as a Rung or a TrainConfig."""
    cfg = hero.train if isinstance(hero, Rung) else hero
    if not isinstance(cfg, TrainConfig):
        raise DelphiError(f"hero: expected a planned Rung or a TrainConfig, got {type(hero).__name__}")
    batch_tokens = cfg.data.batch_size * cfg.data.seq_len
    return {
        "tokens_per_param": cfg.steps * batch_tokens / count_params(cfg.model).nonembedding,
        "steps": float(cfg.steps),
        "batch_tokens": float(batch_tokens),
        "beta2": float(cfg.optim.beta2),
    }


def hero_ranges(spec: LadderSpec, hero: "Rung | TrainConfig", results: "pd.DataFrame | None" = None) -> dict:
    """The hero's tokens per parameter, steps, batch tokens and beta2 against the ladder's ranges.

    {quantity: {"hero", "ladder": [min, max], "inside", "scope", "trained": [min, max]}, ...,
    "inside": all of them, "outside": [quantities outside]}: "ladder" is the range judged (the recipe's
    caps for batch and beta2 under a recipe), "trained" what the rungs of its scope trained. Ranges
    come from `results` (a results DataFrame, its completed rows) or, when None, from the spec's plan.
    A relative slack of 1e-9 absorbs float rounding.
    """
    rows = _ladder_rows(spec, results)
    ranges, scopes, trained = _judged(spec, rows), range_scopes(spec), _trained(rows)
    values = _hero_values(hero)
    out: dict = {}
    for key, (lo, hi) in ranges.items():
        v = values[key]
        inside = lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)
        out[key] = {"hero": v, "ladder": [lo, hi], "inside": bool(inside), "scope": scopes[key]}
        out[key]["trained"] = list(trained[key])
    out["outside"] = [k for k in ranges if not out[k]["inside"]]
    out["inside"] = not out["outside"]
    return out


# How far from N* the hero may be sized (a factor either way) when neither shape bracketing N*
# keeps its steps and tokens per parameter inside the ladder's ranges. The isoFLOP curves are
# flat near their vertex (within 2x of N*, Hoffmann et al. 2022 Fig. 3 and this project's ladders:
# a few hundredths of a nat), and the law predicts the loss of whatever (N, D) is trained, so an
# off-optimal hero inside the ranges is a fairer test than an optimal one outside them.
# The same factor defines "near the optimum" for the depths a hero may have (gate hero_depth): a
# depth the ladder holds only as under-trained rungs far from N* is not one it measured.
HERO_MAX_OFF_OPTIMUM = 2.0
# Where the fitted N* may land relative to the spec's expected optimum, for `hero_preflight`: a span
# around where the default ladder's fitted optima land (benchmarks/default_study/).
PREFLIGHT_FACTORS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0)


def _family_shapes_around(spec: LadderSpec, params: float, convention: str = "nonembedding") -> list[ModelConfig]:
    """The family's shapes just below and above `params` (N counted as `convention`), then the others
    within HERO_MAX_OFF_OPTIMUM of it; nearest (in log N) first."""
    multiple = spec.shape.hero_width_multiple
    n_of = lambda m: params_in_convention(m, spec.seq_len, convention)  # noqa: E731
    widths = set(spec.shape.widths)
    # Grow the grid past the farthest allowed shape, so any N* has a neighbour on both sides.
    w = multiple
    while True:
        widths.add(w)
        if n_of(shape_for_width(spec, w)) > 2 * HERO_MAX_OFF_OPTIMUM * params or w > 1 << 16:
            break
        w += multiple
    shapes = sorted((shape_for_width(spec, w) for w in widths), key=n_of)
    n = [n_of(m) for m in shapes]
    above = next((i for i, v in enumerate(n) if v >= params), len(n) - 1)
    around = shapes[max(0, above - 1) : above + 1]
    distance = lambda m: abs(math.log(n_of(m) / params))  # noqa: E731
    near = [m for m in shapes if distance(m) <= math.log(HERO_MAX_OFF_OPTIMUM) and m not in around]
    return sorted(around, key=distance) + sorted(near, key=distance)


def plan_hero(
    spec: LadderSpec,
    params: float,
    compute: float,
    seed: int = 0,
    results: "pd.DataFrame | None" = None,
    convention: str = "nonembedding",
    depths: set[int] | None = None,
) -> Rung:
    """The hero: a family shape next to `params` (N*, counted as `convention`) trained on exactly `compute` FLOPs.

    Its batch is its own batch rule's, clipped to the top budget's (so batch and beta2 continue the
    ladder's, with no switch where the extrapolation starts). Of the two shapes bracketing N*, the
    nearest whose tokens per parameter and steps fall inside the ladder's ranges (`hero_ranges`, from
    `results` or the plan) is chosen; when neither does, the nearest such shape within
    HERO_MAX_OFF_OPTIMUM of N*; when none does, the nearest, and `hero_ranges` says which range it leaves.
    With `results`, a shape whose depth the ladder trained near its optimum (`depths_near_optimum`)
    is preferred among those inside the ranges; when none is, gate hero_depth refuses the hero.
    Without results, `depths` (e.g. `expected_depths`, the preflight's) plays that part.
    """
    if not (params > 0 and compute > 0 and math.isfinite(params) and math.isfinite(compute)):
        raise DelphiError(f"hero: params and compute must be positive and finite, got {params:g}, {compute:g}")
    rows = _ladder_rows(spec, results)
    top = _top_budget(rows)
    top_batch = int(max(r["batch_size"] for r in rows if r["budget"] == top))
    candidates = []
    for model in _family_shapes_around(spec, params, convention):
        _, tokens = rung_tokens(model, spec.seq_len, compute)
        run_id = f"hero_C{format_budget(compute)}_d{model.d_model}_L{model.n_layers}_s{seed}"
        if spec.recipe is not None:  # the recipe's batch, as every rung's: no switch at the hero
            rung = make_rung(spec, model, compute, seed, run_id=run_id)
            if rung is not None:
                candidates.append(rung)
            continue
        own = batch_for_tokens(spec, tokens)
        if own is None:
            continue
        rung = make_rung(spec, model, compute, seed, run_id=run_id, batch=min(own, top_batch))
        if rung is not None:
            candidates.append(rung)
    if not candidates:
        raise DelphiError(f"--compute: {compute:g} FLOPs gives the hero fewer than batch.min_steps steps")
    inside = [rung for rung in candidates if hero_ranges(spec, rung, results)["inside"]]
    if results is not None:
        depths = depths_near_optimum(results)
    seen = [rung for rung in inside if depths is None or rung.model.n_layers in depths]
    return (seen or inside or candidates)[0]


def depths_near_optimum(results: "pd.DataFrame | None") -> set[int] | None:
    """The n_layers of the ladder's cells within HERO_MAX_OFF_OPTIMUM of their budget's optimal N
    (`delphi.fits.isoflop.near_optimum_cells`, which gate hero_depth reads too); None before any rung
    has a loss (the plan's preflight), when every depth is allowed."""
    if results is None or not {"loss", "params", "budget", "n_layers"} <= set(results.columns):
        return None

    frame = isoflop_rows(results[results["status"] == "completed"] if "status" in results.columns else results)
    if len(frame) == 0:
        return None
    return {int(v) for v in near_optimum_cells(frame, HERO_MAX_OFF_OPTIMUM)["n_layers"]}


def expected_depths(spec: LadderSpec) -> set[int] | None:
    """The depths of the planned isoFLOP shapes within HERO_MAX_OFF_OPTIMUM of their budget's expected
    optimum (isoflop.center_*): before any rung trains, the depths gate hero_depth should allow."""
    if spec.isoflop is None:
        return None
    return {
        r.model.n_layers
        for r in plan_ladder(spec)
        if rung_role(r.run_id) == "isoflop"
        and abs(math.log(r.params / expected_optimum(spec, r.budget))) <= math.log(HERO_MAX_OFF_OPTIMUM)
    }


def hero_preflight(spec: LadderSpec, compute: float, factors: tuple[float, ...] = PREFLIGHT_FACTORS) -> dict:
    """Before any rung trains: would a hero at `compute` fit the ladder's ranges, at a depth the
    ladder should train near its optimum (`expected_depths`), if the fitted N* came out at `factor`
    x the spec's expected optimum (isoflop.center_*)? The fitted optimum is only known after the
    ladder, and such a hero is refused then (gates hero_ranges, hero_depth).

    {"compute", "expected_params", "expected_depths", "expected": the hero at factor 1 (run_id,
    steps, inside, outside), "inside_factors": [lowest, highest] factor whose hero fits (None if
    none), "factors"}; "depth" in `outside` when only the depth does not fit."""
    center = expected_optimum(spec, compute)
    depths = expected_depths(spec)
    rows = []
    for f in factors:
        hero = plan_hero(spec, f * center, compute, depths=depths)
        outside = hero_ranges(spec, hero)["outside"]
        if depths is not None and hero.model.n_layers not in depths:
            outside = [*outside, "depth"]
        rows.append(
            {"factor": f, "run_id": hero.run_id, "steps": hero.steps, "inside": not outside, "outside": outside}
        )
    fits = [r["factor"] for r in rows if r["inside"]]
    expected = next(r for r in rows if r["factor"] == 1.0)
    return {
        "compute": compute,
        "expected_params": center,
        "expected_depths": sorted(depths) if depths else None,
        "expected": expected,
        "inside_factors": [min(fits), max(fits)] if fits else None,
        "factors": rows,
    }


# ---- the hero from a fit -------------------------------------------------------------------------


def hero_from_fit(
    fit_path: str | Path, compute: float, spec: LadderSpec, seed: int = 0, results: "pd.DataFrame | None" = None
) -> tuple[Rung, dict]:
    """(Rung, details) for the hero at `compute` FLOPs; `results` (the ladder's results DataFrame, or
    None for the spec's plan) gives the ranges the hero is sized into; details["ranges"] reports them."""

    if not (compute > 0 and math.isfinite(compute)):
        raise DelphiError(f"--compute: must be a positive number of FLOPs, got {quoted(compute)}")
    fit = load_fit(fit_path)
    prediction = fit.predict(compute=compute)
    n_star, d_star = prediction.get("params"), prediction.get("tokens")
    if n_star is None or not (float(n_star) > 0):
        raise DelphiError(
            f"--fit: {fit_path} ({getattr(fit, 'kind', '?')} fit) does not predict N*(C); use an isoflop, parametric or vpnls fit"
        )
    # N* is counted the way the fit counted it (its FLOPs family says how; plain fits: non-embedding).
    convention = getattr(getattr(fit, "family", None), "convention", None) or "nonembedding"
    rung = plan_hero(spec, float(n_star), compute, seed, results=results, convention=convention)
    error = rung.flops / compute - 1
    if abs(error) > spec.tolerance:
        raise DelphiError(
            f"--compute: the hero reaches {rung.flops:.4g} FLOPs, {error:+.2%} from {compute:g} (tolerance {spec.tolerance:.0%})"
        )
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
