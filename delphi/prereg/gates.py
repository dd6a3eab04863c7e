"""The gates a prediction must pass before it is sealed: one concept (each gate, its evidence's statistics, the report).

Each gate is a pure function of the evidence behind a preregistration (`GateInputs`: the primary
fit, its held-out-budget backtest, its leave-one-budget-out refits, the results table, the hero's
config, the runs beyond the ladder) and reports its name, whether it passed, the measured value,
the threshold and one line of detail. A gate whose evidence is missing fails: a prediction is
sealed on evidence, not on its absence (`--force` seals anyway and says so forever).

On an external table (no rung records of a Delphi ladder, `delphi.fits.data.LADDER_RECORD_COLUMNS`)
a gate that reads only the ladder's records is "not applicable" (`Gate.applicable` False), with its
reason: recorded and shown, never a pass and never a failure. On Delphi's own ladders the same
missing evidence is a failure, and so is a hero given as N and D where the ladder could judge its
config. Why each gate exists: docs/design.md §8.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from delphi.errors import DelphiError
from delphi.fits.calibration import gate_uses_calibration, interval_for_gate
from delphi.fits.data import isoflop_rows
from delphi.fits.diagnostics import FitDiagnostics
from delphi.fits.intervals import Z_90
from delphi.fits.isoflop import MIN_POINTS_PER_BUDGET, near_optimum_cells, parabola_vertex
from delphi.fits.probes import PROBE_CARRIES, probe_trend
from delphi.ladder.collect import relaxed_in_table
from delphi.ladder.hero import HERO_MAX_OFF_OPTIMUM
from delphi.ladder.recipe_check import MAX_LOST_FRAC, gate_problems
from delphi.model.flops import count_params
from delphi.prereg.hero import HeroSpec

# A half-width of the 90% interval wider than this many tolerances cannot decide pass/fail:
# the outcome could be 1.5 tolerances off and still be "covered".
INTERVAL_WIDTH_FACTOR = 1.5
# Seeds per cell needed to measure seed noise at all.
MIN_SEEDS = 2
# Leave-one-budget-out refits need at least two budgets left to fit a trend in C.
MIN_BUDGETS_LOBO = 3
# One-sided 95% normal quantile: a frontier-slope trend counts only when it exceeds
# this many standard errors of the difference between the first and last local slope.
TREND_Z = 1.6448536269514722
# Hero steps / batch / tokens-per-parameter may leave the ladder's range by this share: rounding
# steps to whole batches and picking a shape from the family's width grid move them by well under 1%.
RANGE_SLACK_REL = 0.01
# Gate lr_transfer: the transfer rule may cost a calibrated point at most this share of the
# prediction's tolerance in loss; the law's own error takes the rest: a law fitted on rungs that
# lose loss to a drifting LR carries that loss to the hero.
LR_LOSS_SHARE_OF_TOLERANCE = 0.5
# ... and the hero may train at most this many times longer than the longest calibrated horizon:
# the optimum's drift with tokens is extrapolated over at most 0.6 decade.
LR_HORIZON_REACH = 4.0
# A finished run beyond the ladder (dress rehearsal or probe) rejects a cross-check law that it
# misses by more than the tolerance plus this many sd of one run's noise around the law (it is one
# seed): a 2-sd allowance keeps a one-seed miss from deciding.
PROBE_NOISE_Z = 2.0

GATE_NAMES = (
    "isoflop_vertices",
    "backtest",
    "lobo_spread",
    "interval_width",
    "frontier_slopes",
    "rung_health",
    "seeds",
    "hero_ranges",
    "hero_depth",
    "method_agreement",
    "fit_status",
    "dress_rehearsal",
    "probes",
    "lr_transfer",
    "recipe",
)


@dataclass(frozen=True)
class Gate:
    name: str
    passed: bool
    value: float | str | None
    threshold: str
    detail: str
    applicable: bool = True  # False: the table cannot hold this gate's evidence (module docstring); never a pass

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if isinstance(self.value, (float, np.floating)):
            out["value"] = float(self.value) if math.isfinite(float(self.value)) else None
        out["passed"] = bool(self.passed)
        if self.applicable:
            del out["applicable"]  # a judged gate's JSON is what it always was
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Gate":
        return cls(
            name=str(d["name"]),
            passed=bool(d["passed"]),
            value=d.get("value"),
            threshold=str(d.get("threshold", "")),
            detail=str(d.get("detail", "")),
            applicable=bool(d.get("applicable", True)),
        )

    @property
    def result(self) -> str:
        """PASS, FAIL or N/A (not applicable: neither)."""
        return "N/A" if not self.applicable else "PASS" if self.passed else "FAIL"


def not_applicable(name: str, threshold: str, why: str) -> Gate:
    """A gate whose evidence the table cannot hold (an external table): recorded with its reason, not passed."""
    return Gate(name, False, None, threshold, f"not applicable: {why}", applicable=False)


@dataclass(frozen=True)
class GateThresholds:
    """Thresholds of the gates; `None` tolerances default to the preregistration's tolerance."""

    tolerance_rel: float = 0.01
    backtest_tolerance_rel: float | None = None
    lobo_tolerance_rel: float | None = None
    rehearsal_tolerance_rel: float | None = None
    agreement_tolerance_rel: float | None = None
    interval_width_factor: float = INTERVAL_WIDTH_FACTOR
    min_seeds: int = MIN_SEEDS
    trend_z: float = TREND_Z
    range_slack_rel: float = RANGE_SLACK_REL

    def tol(self, which: str) -> float:
        value = getattr(self, f"{which}_tolerance_rel")
        return float(self.tolerance_rel if value is None else value)

    def validate(self, where: str) -> "GateThresholds":
        for key in (
            "tolerance_rel",
            "backtest_tolerance_rel",
            "lobo_tolerance_rel",
            "rehearsal_tolerance_rel",
            "agreement_tolerance_rel",
        ):
            v = getattr(self, key)
            if v is not None and not 0 < v < 1:
                raise DelphiError(f"{where}: {key}: must be in (0, 1), got {v}")
        if not self.interval_width_factor > 0:
            raise DelphiError(f"{where}: interval_width_factor: must be > 0, got {self.interval_width_factor}")
        if self.min_seeds < 1:
            raise DelphiError(f"{where}: min_seeds: must be >= 1, got {self.min_seeds}")
        if not self.trend_z >= 0 or not self.range_slack_rel >= 0:
            raise DelphiError(f"{where}: trend_z and range_slack_rel must be >= 0")
        return self


def _join(items: list[str], limit: int = 5) -> str:
    """At most `limit` items, then how many more: a detail stays one readable line."""
    return "; ".join(items[:limit]) + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def all_passed(gates: Iterable[Gate]) -> bool:
    """Every gate that could be judged passed (a gate not applicable neither passes nor fails)."""
    return all(g.passed or not g.applicable for g in gates)


def failed_names(gates: Iterable[Gate]) -> list[str]:
    return [g.name for g in gates if not g.passed and g.applicable]


def not_applicable_names(gates: Iterable[Gate]) -> list[str]:
    return [g.name for g in gates if not g.applicable]


# --------------------------------------------------------------------------- cells and seed noise


def cell_keys(table: pd.DataFrame) -> list[str]:
    """A cell is one (budget, shape): the ladder's `cell_id`, else (budget, params)."""
    if "cell_id" in table.columns:
        return ["cell_id"]
    return [c for c in ("budget", "params") if c in table.columns]


def cells(table: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: budget, params, tokens (means), loss_mean, loss_std (ddof=1), n_seeds."""
    keys = cell_keys(table)
    spec = {
        "budget": ("budget", "first"),
        "params": ("params", "mean"),
        "loss_mean": ("loss", "mean"),
        "loss_std": ("loss", "std"),
        "n_seeds": ("loss", "size"),
    }
    if "tokens" in table.columns:
        spec["tokens"] = ("tokens", "mean")
    agg = table.groupby(keys, sort=True).agg(**spec).reset_index(drop=True)
    return agg.sort_values(["budget", "params"]).reset_index(drop=True)


def pooled_seed_noise(table: pd.DataFrame) -> float | None:
    """Pooled within-cell standard deviation of the final loss (nats); None with one seed per cell."""
    c = cells(table)
    dof = (c["n_seeds"] - 1).clip(lower=0)
    if dof.sum() == 0:
        return None
    return float(np.sqrt(np.nansum(dof * c["loss_std"].fillna(0.0) ** 2) / dof.sum()))


# --------------------------------------------------------------------------- individual gates


def gate_isoflop_vertices(table: pd.DataFrame) -> Gate:
    """Every budget's parabola in ln N (over cell means) is convex with its vertex inside the sampled N."""
    threshold = "every budget: parabola in ln N convex, vertex inside the sampled N range"
    c = cells(isoflop_rows(table))
    bad, n = [], 0
    for budget, g in c.groupby("budget", sort=True):
        n += 1
        if g["params"].nunique() < MIN_POINTS_PER_BUDGET:
            bad.append(f"{budget:.3g}: {g['params'].nunique()} sizes (need {MIN_POINTS_PER_BUDGET})")
            continue
        v = parabola_vertex(np.log(g["params"].to_numpy(float)), g["loss_mean"].to_numpy(float))
        if not v["convex"]:
            bad.append(f"{budget:.3g}: not convex")
        elif not v["inside"]:
            side = "below" if v["x"] < np.log(g["params"].min()) else "above"
            bad.append(f"{budget:.3g}: vertex N={math.exp(v['x']):.3g} {side} the sampled range")
    ok = n - len(bad)
    if n == 0:
        return Gate("isoflop_vertices", False, None, threshold, "no budgets in the results table")
    detail = "all vertices interior" if not bad else _join(bad)
    return Gate("isoflop_vertices", not bad, f"{ok}/{n}", threshold, detail)


def _budget_entries(backtest: dict | None) -> list[dict]:
    return list((backtest or {}).get("budgets") or [])


def gate_backtest(backtest: dict | None, tolerance_rel: float, *, exact_required: bool) -> Gate:
    """Held-out-budget backtest: every held-out budget's |error| <= tolerance, scored at exact FLOPs."""
    threshold = f"|error| <= {tolerance_rel:.2%} at every held-out budget" + (
        ", exact-FLOP allocation" if exact_required else ""
    )
    if not backtest or backtest.get("error") or not _budget_entries(backtest):
        why = (backtest or {}).get("error") or "no backtest (too few budgets to hold one out?)"
        return Gate("backtest", False, None, threshold, f"not evaluated: {why}")
    entries = _budget_entries(backtest)
    errors = [float(b["rel_error"]) for b in entries]
    worst = max(errors, key=abs)
    allocations = {b.get("allocation") or backtest.get("allocation") for b in entries} - {None}
    not_exact = exact_required and "6ND" in allocations
    cover = [b.get("covered_90") for b in entries if b.get("covered_90") is not None]
    parts = [
        f"{b['budget']:.3g}: {float(b['rel_error']):+.2%}"
        + ("" if b.get("law_rel_error") is None else f" (the law's own {float(b['law_rel_error']):+.2%})")
        + ("" if b.get("covered_90") is None else (" (covered)" if b["covered_90"] else " (not covered)"))
        for b in entries
    ]
    detail = (
        ("the calibrated centre, the point that decides: " if any("law_rel_error" in b for b in entries) else "")
        + ", ".join(parts)
        + f"; allocation {', '.join(sorted(allocations)) or 'unrecorded'}"
    )
    if cover:
        detail += f"; 90% coverage {sum(cover)}/{len(cover)}"
    if not_exact:
        detail = "scored at 6ND although the family's exact FLOPs are known; " + detail
    passed = abs(worst) <= tolerance_rel and not not_exact
    return Gate("backtest", passed, abs(worst), threshold, detail)


def leave_one_budget_out(
    table: pd.DataFrame, refit: Callable[[pd.DataFrame], Any], predict_loss: Callable[[Any], float]
) -> dict[str, Any]:
    """Refit without each budget in turn and predict the hero: {"budgets": [{budget, loss}], "error"}."""
    budgets = sorted(float(b) for b in table["budget"].unique())
    if len(budgets) < MIN_BUDGETS_LOBO:
        return {"budgets": [], "error": f"{len(budgets)} budget(s); leaving one out needs at least {MIN_BUDGETS_LOBO}"}
    out = []
    for budget in budgets:
        sub = table[table["budget"] != budget].reset_index(drop=True)
        sub.attrs = dict(table.attrs)
        try:
            loss = float(predict_loss(refit(sub)))
        except (DelphiError, ValueError, TypeError, KeyError, ZeroDivisionError) as e:
            out.append({"budget": budget, "loss": None, "error": f"{type(e).__name__}: {e}"})
            continue
        out.append({"budget": budget, "loss": loss if math.isfinite(loss) else None})
    return {"budgets": out}


def gate_lobo_spread(lobo: dict | None, full_loss: float, tolerance_rel: float) -> Gate:
    """Every leave-one-budget-out hero prediction within +-tolerance of the full prediction."""
    threshold = f"each within +-{tolerance_rel:.2%} of the full prediction (spread <= {2 * tolerance_rel:.2%})"
    if not lobo or lobo.get("error"):
        return Gate("lobo_spread", False, None, threshold, f"not evaluated: {(lobo or {}).get('error', 'no refits')}")
    failed = [b for b in lobo["budgets"] if b.get("loss") is None]
    if failed:
        return Gate(
            "lobo_spread",
            False,
            None,
            threshold,
            "refit failed without budget "
            + ", ".join(f"{b['budget']:.3g} ({b.get('error', 'no loss')})" for b in failed),
        )
    dev = np.array([b["loss"] / full_loss - 1 for b in lobo["budgets"]])
    spread = float(dev.max() - dev.min())
    detail = "without " + _join([f"{b['budget']:.3g}: {d:+.2%}" for b, d in zip(lobo["budgets"], dev)], 8)
    return Gate(
        "lobo_spread",
        bool(np.abs(dev).max() <= tolerance_rel),
        spread,
        threshold,
        f"range [{dev.min():+.2%}, {dev.max():+.2%}]; {detail}",
    )


def gate_interval_width(final: dict, tolerance_rel: float, factor: float) -> Gate:
    """The 90% interval's half-width (relative to the prediction) is at most `factor` tolerances."""
    limit = factor * tolerance_rel
    threshold = f"90% half-width <= {factor:g} x tolerance = {limit:.2%}"
    i90, centre, note, beyond = interval_for_gate(final)
    if not i90 or i90[0] is None:
        return Gate(
            "interval_width", False, None, threshold, "the prediction has no 90% interval (fit without a bootstrap?)"
        )
    half = (float(i90[1]) - float(i90[0])) / 2 / centre
    detail = f"{note}90% [{float(i90[0]):.4f}, {float(i90[1]):.4f}] around {centre:.4f}: half-width {half:.2%}"
    if beyond:
        return Gate("interval_width", False, half, threshold, detail + "; " + beyond)
    scatter = final.get("residual_scatter_nats")
    if half > limit and isinstance(scatter, (int, float)) and math.isfinite(scatter):
        # The law's own misfit to the ladder is a floor no bootstrap or hero seed count removes.
        floor = Z_90 * float(scatter) / float(final["loss"])
        detail += f"; the law's residual scatter alone ({float(scatter):.4f} nats) gives +-{floor:.2%}" + (
            ": no hero can pass until the ladder's points sit closer to the law (more seeds per cell, larger batches)"
            if floor > limit
            else ""
        )
    if parts := interval_parts(final):
        detail += (
            f"; sd {parts['sd_rel']:.2%} = the fit's bootstrap {parts['bootstrap_sd_rel']:.2%} (+) the outcome's run noise "
            f"{parts['run_sd_rel']:.2%} (+) the calibration's model error {parts['model_sd_rel']:.2%}; "
            f"with no run noise at all the half-width would be {parts['half_without_run_noise_rel']:.2%}"
            + (
                " (no hero, of any number of seeds, can pass: the law's own uncertainty this far out is over the limit)"
                if parts["half_without_run_noise_rel"] > limit
                else ""
            )
        )
    return Gate("interval_width", half <= limit, half, threshold, detail)


def interval_parts(final: dict) -> dict[str, float] | None:
    """The calibrated 90% interval's relative sd split into the terms added in quadrature to build it
    (delphi.fits.calibration.calibrated_prediction over delphi.prereg.predict.predictive): the fit's
    bootstrap, one run's noise around the law (residual scatter (+) seed noise) and the calibration's
    model error; and the half-width left if the run's noise were zero, which says whether any hero
    (however many seeds) could pass. None without a calibrated interval or the run's noise."""
    cal = final.get("calibrated") or {}
    if not gate_uses_calibration(final) or "base_sd_rel" not in cal:
        return None
    noise = [
        float(final[k])
        for k in ("residual_scatter_nats", "seed_noise_nats")
        if isinstance(final.get(k), (int, float)) and math.isfinite(final[k])
    ]
    if not noise:
        return None
    if isinstance(final.get("seed_noise_nats"), (int, float)) and final.get("n_seeds"):  # the noise of a seed mean
        noise[-1] /= math.sqrt(int(final["n_seeds"]))
    run_sd_rel = math.hypot(*noise) / float(
        (final.get("law") or final)["loss"]
    )  # relative to the law's uncalibrated point
    base, model, sd = float(cal["base_sd_rel"]), float(cal["model_sd_rel"]), float(cal["sd_rel"])
    bootstrap = math.sqrt(max(base**2 - run_sd_rel**2, 0.0))
    half = (float(cal["loss_90"][1]) - float(cal["loss_90"][0])) / 2 / float(cal["loss"])
    return {
        "sd_rel": sd,
        "bootstrap_sd_rel": bootstrap,
        "run_sd_rel": run_sd_rel,
        "model_sd_rel": model,
        "half_without_run_noise_rel": half * math.hypot(bootstrap, model) / sd,
    }


def budget_best_losses(table: pd.DataFrame) -> pd.DataFrame:
    """Per budget: the best loss L* (the isoFLOP parabola's vertex over cell means when it is convex and
    inside the sampled range, else the lowest cell mean) and the seeds behind the best cell."""
    c = cells(isoflop_rows(table))
    rows = []
    for budget, g in c.groupby("budget", sort=True):
        best = g.loc[g["loss_mean"].idxmin()]
        loss = float(best["loss_mean"])
        if g["params"].nunique() >= MIN_POINTS_PER_BUDGET:
            v = parabola_vertex(np.log(g["params"].to_numpy(float)), g["loss_mean"].to_numpy(float))
            if v["convex"] and v["inside"]:
                loss = float(v["loss"])
        rows.append({"budget": float(budget), "loss": loss, "n_seeds": float(best["n_seeds"])})
    return pd.DataFrame(rows)


def frontier_slopes(
    table: pd.DataFrame, seed_noise_nats: float | None = None, irreducible: float = 0.0
) -> list[dict[str, float]]:
    """Local slopes -d ln(L* - E) / d ln C between consecutive budgets, with standard errors.

    Under L*(C) = E + G C^-gamma these are all gamma: a trend means the ladder is not yet on the
    law it is fitted with. E is the fit's
    irreducible loss (0 for laws without one). The SE of ln(L* - E) is the seed noise over
    sqrt(seeds) over (L* - E); 0 when the noise is unknown."""
    best = budget_best_losses(table)
    noise = seed_noise_nats if seed_noise_nats is not None else (pooled_seed_noise(table) or 0.0)
    b = best["budget"].to_numpy(float)
    excess = best["loss"].to_numpy(float) - irreducible
    if (excess <= 0).any():
        raise DelphiError(f"frontier slopes: a best loss is not above the irreducible loss E = {irreducible:.4g}")
    se_ln = noise / np.sqrt(best["n_seeds"].to_numpy(float)) / excess
    out = []
    for i in range(len(b) - 1):
        dlnc = math.log(b[i + 1] / b[i])
        out.append(
            {
                "from": float(b[i]),
                "to": float(b[i + 1]),
                "slope": float(-(math.log(excess[i + 1]) - math.log(excess[i])) / dlnc),
                "se": float(math.hypot(se_ln[i], se_ln[i + 1]) / dlnc),
            }
        )
    return out


def gate_frontier_slopes(slopes: list[dict[str, float]], z: float) -> Gate:
    """No significant monotone trend: slopes strictly monotone AND last - first beyond z standard errors fails."""
    threshold = f"no monotone trend beyond {z:.3g} standard errors"
    if len(slopes) < 2:
        return Gate(
            "frontier_slopes", False, None, threshold, f"{len(slopes) + 1} budget(s): need 3 for two local slopes"
        )
    s = np.array([x["slope"] for x in slopes])
    diffs = np.diff(s)
    monotone = bool((diffs > 0).all() or (diffs < 0).all())
    trend = float(s[-1] - s[0])
    se = math.hypot(slopes[0]["se"], slopes[-1]["se"])
    significant = abs(trend) > z * se
    listing = ", ".join(f"{x:.4f}" for x in s)
    if monotone and significant:
        word = "steepening" if trend > 0 else "flattening"
        detail = (
            f"slopes {listing}: {word} at every budget ({trend:+.4f}, {abs(trend) / se:.1f} SE)"
            if se > 0
            else f"slopes {listing}: {word} at every budget ({trend:+.4f}; seed noise unknown)"
        )
    else:
        detail = f"slopes {listing}: " + (
            "no monotone trend" if not monotone else f"monotone but within noise ({trend:+.4f}, SE {se:.4f})"
        )
    return Gate("frontier_slopes", not (monotone and significant), trend, threshold, detail)


def gate_rung_health(table: pd.DataFrame, external: bool = False) -> Gate:
    """Every rung inside the health bounds its ladder spec set (columns health_ok / health_issues)."""
    threshold = "every rung within the ladder spec's health bounds"
    if "health_ok" not in table.columns and external:
        return not_applicable(
            "rung_health",
            threshold,
            "an external table has no rung health records (health_ok is "
            "written by `delphi ladder collect`); the lab's own checks stand in",
        )
    if "health_ok" not in table.columns:
        return Gate(
            "rung_health",
            False,
            None,
            threshold,
            "not evaluated: the results table has no health_ok column (collect it with `delphi ladder collect`)",
        )
    ok = table["health_ok"].map(lambda v: str(v).strip().lower() in ("true", "1", "1.0", "yes"))
    bad = table[~ok]
    detail = "all rungs healthy"
    if len(bad):
        issues = (
            bad["health_issues"].fillna("").astype(str)
            if "health_issues" in bad
            else pd.Series([""] * len(bad), index=bad.index)
        )
        names = bad["run_id"].astype(str) if "run_id" in bad else bad.index.astype(str)
        counts: dict[str, int] = {}
        for text in issues:
            for issue in filter(None, text.split(";")):
                counts[issue] = counts.get(issue, 0) + 1
        detail = (
            ", ".join(f"{k} ({v})" for k, v in sorted(counts.items())) or "unhealthy"
        ) + f"; e.g. {', '.join(list(names)[:3])}"
    relaxed = relaxed_in_table(table)
    if relaxed:
        detail += f"; the spec's bounds are looser than the defaults: {', '.join(relaxed)}"
    return Gate("rung_health", len(bad) == 0, f"{len(bad)}/{len(table)} unhealthy", threshold, detail)


def gate_seeds(table: pd.DataFrame, min_seeds: int, external: bool = False) -> Gate:
    """Every cell trained with at least `min_seeds` seeds, so seed noise is measured, not assumed.
    `external` without a seed column: not applicable (which rows are seeds of one run is not recorded)."""
    threshold = f">= {min_seeds} seeds in every cell"
    if external and "seed" not in table.columns:
        return not_applicable(
            "seeds",
            threshold,
            "an external table without a seed column does not record which rows "
            "are seeds of one run; the interval carries the law's scatter about the table",
        )
    c = cells(table)
    fewest = int(c["n_seeds"].min())
    noise = pooled_seed_noise(table)
    detail = f"{len(c)} cells, seeds per cell {fewest}..{int(c['n_seeds'].max())}; " + (
        f"pooled seed noise {noise:.4f} nats" if noise is not None else "seed noise not measurable"
    )
    return Gate("seeds", fewest >= min_seeds, fewest, threshold, detail)


def hero_facts(cfg) -> dict[str, float]:
    """What the ranges and depth gates compare: the hero's tokens per (non-embedding) parameter, steps,
    batch, beta2, its n_layers and its exact FLOPs. A hero given as N and D (delphi.prereg.hero.HeroSpec)
    has its tokens per parameter, tokens and FLOPs only."""
    if isinstance(cfg, HeroSpec):
        return cfg.facts()
    n = count_params(cfg.model).nonembedding
    return {
        "tokens_per_param": cfg.tokens / n,
        "steps": float(cfg.steps),
        "batch_tokens": float(cfg.data.batch_size * cfg.data.seq_len),
        "beta2": float(cfg.optim.beta2),
        "n_layers": float(cfg.model.n_layers),
        "d_model": float(cfg.model.d_model),
        "tokens": float(cfg.tokens),
        "flops": float(cfg.flops),
    }


RANGE_COLUMNS = ("tokens_per_param", "steps", "batch_tokens")
# Scope of each range, as delphi.ladder.plan.RANGE_SCOPES: training length and data per parameter
# against every rung; batch and beta2 against the top budget's (no switch where extrapolation starts).
TOP_BUDGET_SCOPED = ("batch_tokens", "beta2")


def ladder_ranges(table: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """[min, max] of tokens per parameter and steps over the ladder, of batch tokens and beta2 over
    its top budget (the results-table twin of delphi.ladder.plan.ladder_ranges)."""
    out = {}
    budgets = isoflop_rows(table)["budget"] if "budget" in table.columns else None
    top = table[table["budget"] == budgets.max()] if budgets is not None else table
    for col in RANGE_COLUMNS + ("beta2",):
        frame = top if col in TOP_BUDGET_SCOPED else table
        if col in frame.columns and frame[col].notna().any():
            out[col] = (float(frame[col].min()), float(frame[col].max()))
        elif col == "tokens_per_param" and {"tokens", "params"} <= set(table.columns):
            ratio = table["tokens"] / table["params"]
            out[col] = (float(ratio.min()), float(ratio.max()))
    return out


def gate_hero_ranges(
    hero: dict[str, float],
    ranges: dict[str, tuple[float, float]],
    slack_rel: float,
    external: bool = False,
    scopes: dict[str, str] | None = None,
    trained: dict[str, tuple[float, float]] | None = None,
) -> Gate:
    """The hero's tokens/param and steps inside the ladder's ranges; batch and beta2 inside the top
    budget's, or, where `scopes` names them "recipe caps" (delphi.ladder.hero.range_scopes), inside
    the recipe's caps, with the range the top budget `trained` and how far beyond it the hero is
    written beside them. `external`: the table is not a Delphi ladder's: the ranges it records are
    judged (tokens per parameter, from its N and D), the others named as not recorded; none at all is
    not applicable."""
    scopes, trained = scopes or {}, trained or {}
    by_recipe = [c for c in ("batch_tokens", "beta2") if scopes.get(c) == "recipe caps"]
    threshold = (
        "tokens/param, steps inside the ladder's [min, max]; "
        + (
            "batch, beta2 inside the recipe's caps (the rule the hero continues; gate recipe checks it there)"
            if by_recipe
            else "batch, beta2 inside the top budget's"
        )
        + (f" (+-{slack_rel:.0%})" if slack_rel else "")
    )
    missing = [c for c in RANGE_COLUMNS if c not in ranges]
    unknown = [c for c in RANGE_COLUMNS if c in ranges and c not in hero]
    if external:
        ranges = {c: r for c, r in ranges.items() if c in hero}
        if not ranges:
            return not_applicable(
                "hero_ranges",
                threshold,
                "the external table records none of the ranges "
                f"({', '.join(RANGE_COLUMNS)}) the hero could be compared with",
            )
    elif missing:
        return Gate("hero_ranges", False, None, threshold, f"not evaluated: the ladder has no {', '.join(missing)}")
    elif unknown:
        return Gate(
            "hero_ranges",
            False,
            None,
            threshold,
            f"not evaluated: the hero is given as N and D: its {', '.join(unknown)} "
            "are unknown (give --hero HERO.yaml, the config it trains)",
        )
    outside, parts = [], []
    for col, (lo, hi) in ranges.items():
        if col not in hero:
            continue
        v = float(hero[col])
        slack = 1e-9 if col == "beta2" else slack_rel  # beta2 continues exactly or it switched
        inside = lo * (1 - slack) <= v <= hi * (1 + slack)
        parts.append(
            (f"{col} {v:.4g} in [{lo:.4g}, {hi:.4g}]" if inside else f"{col} {v:.4g} OUTSIDE [{lo:.4g}, {hi:.4g}]")
            + (_beyond_trained(col, v, trained[col]) if col in by_recipe and col in trained else "")
        )
        if not inside:
            outside.append(col)
    if external and (missing or unknown):
        parts.append(
            f"not judged: {', '.join(missing + unknown)} (not recorded in an external table, or unknown for the hero)"
        )
    return Gate("hero_ranges", not outside, ", ".join(outside) if outside else "inside", threshold, "; ".join(parts))


def _beyond_trained(col: str, value: float, trained: tuple[float, float]) -> str:
    """' (recipe caps; the top budget trained [lo, hi], the hero 2x beyond)' for a range judged by a
    recipe's caps; beta2's distance is taken in its memory horizon 1 / (1 - beta2), in steps."""

    def scale(x: float) -> float:
        return 1 / (1 - x) if col == "beta2" else x

    lo, hi = trained
    factor = max(scale(value) / scale(hi), scale(lo) / scale(value), 1.0)
    unit = " in 1/(1-beta2)" if col == "beta2" else ""
    where = "inside it" if factor == 1.0 else f"the hero {factor:.3g}x beyond{unit}"
    return f" (recipe caps; the top budget trained [{lo:.4g}, {hi:.4g}], {where})"


def gate_hero_depth(table: pd.DataFrame, hero_layers: int | None, factor: float, external: bool = False) -> Gate:
    """The hero's depth is one the ladder trained within `factor` of some budget's compute optimum.

    The law's N-term is identified by the rungs near each optimum; a depth seen only far from it
    (the largest, most undertrained rungs) is an extrapolation in architecture as well as in scale."""
    threshold = f"the hero's n_layers among the depths of cells within {factor:g}x of a budget's optimal N"
    if "n_layers" not in table.columns:
        if external:
            return not_applicable("hero_depth", threshold, "the external table records no depth (no n_layers column)")
        return Gate("hero_depth", False, None, threshold, "not evaluated: the results table has no n_layers column")
    if hero_layers is None:
        return Gate(
            "hero_depth",
            False,
            None,
            threshold,
            "not evaluated: the hero is given as N and D: its depth is unknown "
            "(give --hero HERO.yaml, the config it trains)",
        )
    near = near_optimum_cells(isoflop_rows(table), factor)
    depths = sorted({int(v) for v in near["n_layers"]})
    all_depths = sorted({int(v) for v in table["n_layers"]})
    detail = f"hero L{hero_layers}; near-optimal cells have L{', L'.join(map(str, depths))}"
    if hero_layers not in depths:
        detail += f"; L{hero_layers} " + (
            "trained only far from the optimum" if hero_layers in all_depths else "never trained"
        )
    return Gate("hero_depth", hero_layers in depths, hero_layers, threshold, detail)


def gate_method_agreement(final_loss: float, cross_checks: dict[str, dict] | None, tolerance_rel: float) -> Gate:
    """Every cross-check law that the evidence does not already reject predicts the hero within
    +-tolerance of the primary law.

    `cross_checks`: method -> {"loss", "backtest_rel_error", "probes"} or {"error"}
    (`delphi.prereg.measure.cross_check_predictions`); "probes" maps each finished run beyond the
    ladder (the dress rehearsal, sealed probes) to {"rel_error", "noise_rel"}. A cross-check is
    shown, not counted, when its held-out-budget backtest (seed-averaged cells) misses by more than
    the tolerance, or a run beyond the ladder misses it by more than the tolerance plus
    PROBE_NOISE_Z x that run's noise: the data already contradict it, so it is no competing
    explanation. Why the gate: two laws that both survive the evidence and still disagree at the
    hero mean the ladder cannot tell which extrapolation is right."""
    threshold = (
        f"each cross-check within +-{tolerance_rel:.2%} of the primary prediction (a cross-check counts "
        f"when its held-out-budget backtest is within +-{tolerance_rel:.2%} and no run beyond the ladder misses "
        f"it by more than that plus {PROBE_NOISE_Z:g} sd of one run's noise)"
    )
    if cross_checks is None:
        return Gate(
            "method_agreement", False, None, threshold, "not evaluated: no results table to fit the cross-checks on"
        )
    if not cross_checks:
        return Gate("method_agreement", True, 0.0, threshold, "no cross-check law: the primary is the only law fitted")
    errors = [
        f"{k}: {v.get('error') or 'no finite prediction'}"
        for k, v in cross_checks.items()
        if v.get("error") or v.get("loss") is None
    ]
    if errors:
        return Gate("method_agreement", False, None, threshold, _join(errors))
    parts, counted = [], []
    for name, v in cross_checks.items():
        dev = float(v["loss"]) / final_loss - 1
        backtest = v.get("backtest_rel_error")
        shown = "" if backtest is None else f"; its backtest {float(backtest):+.2%}"
        rejected_by = []
        for run, p in (v.get("probes") or {}).items():
            allowed = tolerance_rel + PROBE_NOISE_Z * float(p.get("noise_rel") or 0.0)
            shown += f"; {run} {float(p['rel_error']):+.2%}"
            if abs(float(p["rel_error"])) > allowed:
                rejected_by.append(f"{run} beyond +-{allowed:.2%}")
        why_not = ([] if backtest is None or abs(float(backtest)) <= tolerance_rel else ["its backtest"]) + rejected_by
        if v.get("law_loss") is not None and v.get("calibrated", True):
            shown = f"; its calibrated centre, the law's own {float(v['law_loss']):.4f}" + shown
        parts.append(
            f"{name} {float(v['loss']):.4f} ({dev:+.2%}{shown}"
            + (f"; not counted: {', '.join(why_not)})" if why_not else ")")
        )
        if not why_not:
            counted.append(dev)
    worst = max(counted, key=abs) if counted else 0.0
    detail = f"primary {final_loss:.4f}; " + ", ".join(parts)
    return Gate("method_agreement", abs(worst) <= tolerance_rel, abs(worst), threshold, detail)


def gate_fit_status(fit: Any) -> Gate:
    """The primary fit converged with no parameter on a bound (FitResult.status, diagnostics.at_bound)."""
    threshold = "status ok: converged, no parameter on a bound"
    diag = getattr(fit, "diagnostics", None) or FitDiagnostics()
    status = getattr(fit, "status", None)
    at_bound = list(diag.at_bound or [])
    converged = diag.converged
    if status in (None, "ok"):  # a fit file without a status carries only the diagnostics
        status = "at_bound" if at_bound else ("not_converged" if converged is False else "ok")
    detail = f"{getattr(fit, 'kind', '?')} fit ({getattr(fit, 'method', '?')}): status {status}"
    if at_bound:
        detail += f"; on a bound: {', '.join(at_bound)}"
    return Gate("fit_status", status == "ok", str(status), threshold, detail)


def gate_dress_rehearsal(rehearsal: dict, tolerance_rel: float) -> Gate:
    """The ~3x dress rehearsal's final loss within tolerance of the law's prediction for it."""
    threshold = f"|error| <= {tolerance_rel:.2%}"
    if rehearsal.get("error"):
        return Gate("dress_rehearsal", False, None, threshold, f"not evaluated: {rehearsal['error']}")
    rel = float(rehearsal["rel_error"])
    covered = rehearsal.get("covered_90")
    detail = (
        f"{rehearsal.get('compute', float('nan')):.3g} FLOPs: predicted {rehearsal['predicted']:.4f}, "
        f"actual {rehearsal['actual']:.4f} ({rel:+.2%})"
        + ("" if covered is None else ("; inside the 90% interval" if covered else "; outside the 90% interval"))
    )
    return Gate("dress_rehearsal", abs(rel) <= tolerance_rel, rel, threshold, detail)


def ladder_top_budget(table: pd.DataFrame) -> float:
    """The largest isoFLOP budget of a results table: where extrapolation starts."""
    return float(isoflop_rows(table)["budget"].max())


def gate_probes(
    probes: dict[str, dict],
    tolerance_rel: float,
    *,
    top_budget: float | None = None,
    hero_compute: float | None = None,
    corrected: bool = False,
    carry: str = "linear",
) -> Gate:
    """Every finished probe beyond the ladder (sealed before it trained) scored against the primary
    law at its own N and D. `probes`: name -> `run_predicted_vs_actual` (or {"error"}).

    Uncorrected (the prediction is the primary law's): every probe within tolerance, as a dress
    rehearsal must be, and with two or more probes their error trend (`ProbeTrend`) carried to the
    hero within tolerance too. Corrected (the prediction is the law x (1 + the trend carried to the
    hero), `delphi.fits.probes.correct_by_probes`): the correction must have been tested, so at
    least three probes; the trend fitted without the furthest probe predicts it within tolerance;
    every probe the carry rests on (`ProbeTrend.used`: all for the line, the two furthest for the
    local slope) lies within tolerance of the trend; and the hero is no farther beyond the furthest
    probe (in log C) than those probes span. `carry`: how the trend carries the errors (PROBE_CARRIES)."""
    rests_on = "the probes' span" if carry == "linear" else "the span of the two it rests on"
    threshold = (
        f"the correction, fitted without the furthest probe, predicts it within {tolerance_rel:.2%}; every "
        f"probe {'' if carry == 'linear' else 'it rests on '}within {tolerance_rel:.2%} of the trend; the hero "
        f"beyond the furthest probe by at most {rests_on} in log C"
        if corrected
        else f"|error| <= {tolerance_rel:.2%} at every probe and carried to the hero"
    )
    if not probes:
        return Gate("probes", False, None, threshold, "not evaluated: no probe runs")
    problems, parts, worst = [], [], 0.0
    for name, r in probes.items():
        if r.get("error"):
            problems.append(f"{name}: {r['error']}")
            continue
        rel = float(r["rel_error"])
        parts.append(
            f"{name} ({r.get('compute', float('nan')):.3g} FLOPs): predicted {r['predicted']:.4f}, "
            f"actual {r['actual']:.4f} ({rel:+.2%})"
        )
        if not corrected:
            worst = max(worst, abs(rel))
            if abs(rel) > tolerance_rel:
                problems.append(f"{name} {rel:+.2%}")
    trend = probe_trend(probes, top_budget, carry) if top_budget is not None else None
    if trend is not None and hero_compute is not None:
        how = "linear in log C" if carry == "linear" else PROBE_CARRIES[carry]
        parts.append(f"carried to the hero's {hero_compute:.3g} FLOPs ({how}): {trend.at(hero_compute):+.2%}")
        if not corrected:
            worst = max(worst, abs(trend.at(hero_compute)))
            if abs(trend.at(hero_compute)) > tolerance_rel:
                problems.append(f"carried to the hero {trend.at(hero_compute):+.2%}")
    if corrected:
        tested = trend.leave_last_out() if trend is not None else None
        if tested is not None:
            worst = abs(tested[1])
            parts.append(f"the trend without {tested[0]} predicts it at {tested[1]:+.2%}")
        if trend is not None and hero_compute is not None:
            beyond, span = trend.reach(hero_compute)
            spanning = "probes span" if carry == "linear" else "the two it rests on span"
            parts.append(f"the hero {10**beyond:.3g}x beyond the furthest probe ({spanning} {10**span:.3g}x)")
        problems += (
            trend.untested(tolerance_rel, hero_compute)
            if trend is not None
            else ["a correction by the probes needs >= 3 finished probes at distinct computes"]
        )
    detail = "; ".join(parts) + (f"; outside: {_join(problems)}" if problems else "")
    return Gate("probes", not problems, worst if parts else None, threshold, detail)


def gate_lr_transfer(
    drift: list[dict],
    hero: dict[str, float],
    tolerance_rel: float,
    share: float = LR_LOSS_SHARE_OF_TOLERANCE,
    reach: float = LR_HORIZON_REACH,
) -> Gate:
    """The ladder's LR transfer rule is near the measured optimum wherever it was calibrated, and
    the calibration reaches the hero: its width, and its horizon within `reach`.

    `drift`: `delphi.ladder.lr_calibration.rule_drift` of an `lr-calibrate` report under the
    ladder's rule today. A law fitted to rungs whose LR drifts away from the optimum with width or
    horizon extrapolates the drift with the scale."""
    limit = share * tolerance_rel
    threshold = (
        f"the rule's LR costs every calibrated point <= {limit:.2%} of loss; calibrated up to the hero's "
        f"width and to >= 1/{reach:g} of its tokens"
    )
    if not drift:
        return Gate("lr_transfer", False, None, threshold, "not evaluated: the calibration has no points")
    problems, parts = [], []
    for row in drift:
        where = f"d{row['d_model']}@{row['tokens']:.3g}"
        if row["m_now"] is None:
            problems.append(f"{where}: no interior optimum (widen --multipliers)")
            continue
        parts.append(f"{where} LR* = {row['m_now']:.2f}x rule ({row['lost_frac_now']:.2%})")
        if row["lost_frac_now"] > limit:
            problems.append(
                f"{where}: the rule's LR is {1 / row['m_now']:.2f}x the optimum, costing {row['lost_frac_now']:.2%}"
            )
    widest = max(row["d_model"] for row in drift)
    longest = max(row["tokens"] for row in drift)
    if "d_model" in hero and hero["d_model"] > widest:
        problems.append(f"hero d_model {hero['d_model']:.0f} wider than any calibrated point ({widest})")
    if "tokens" in hero and hero["tokens"] > reach * longest:
        problems.append(
            f"hero trains {hero['tokens']:.3g} tokens, > {reach:g}x the longest calibrated horizon {longest:.3g}"
        )
    worst = max((row["lost_frac_now"] for row in drift if row["lost_frac_now"] is not None), default=None)
    detail = _join(problems) if problems else _join(parts, limit=8)
    return Gate("lr_transfer", not problems, worst, threshold, detail)


def gate_recipe(report: dict, hero: dict[str, float] | None = None) -> Gate:
    """The recipe loses <= 0.5% at every point of its check, and its trend carries <= 0.5% to the
    hero, whose width and tokens the check reached (delphi.ladder.recipe_check)."""
    threshold = (
        f"every recipe-check point and the trend carried to the hero lose <= {MAX_LOST_FRAC:.1%} against the "
        "sweep's optimum; the check reaches the hero's width and tokens"
    )
    problems, parts, worst = gate_problems(report, hero)
    return Gate("recipe", not problems, worst, threshold, _join(problems) if problems else _join(parts, limit=8))


# --------------------------------------------------------------------------- all together


@dataclass(frozen=True)
class GateInputs:
    """What the gates read, measured from the evidence (`delphi.prereg.measure.compute_gates`).

    `fit` the primary FitResult; `table` the results table (one row per run and seed; None: none
    given); `final` the hero's prediction {loss, loss_90}; `hero` from `hero_facts`; `backtest` the
    primary law's held-out-budget backtest; `lobo` from `leave_one_budget_out`; `ranges` the
    ladder's ranges (None: from the table), `range_scopes` and `trained_ranges` what they are
    (`gate_hero_ranges`); `rehearsal` {predicted, actual, rel_error, covered_90,
    compute} when a dress rehearsal ran; `cross_checks` other laws' predictions for the hero
    (`gate_method_agreement`); `exact_required` whether the backtest must be scored at exact FLOPs
    (None: when the law is in (N, D) with a FLOPs family); `lr_drift` the ladder's LR rule against a
    calibration (`gate_lr_transfer`; no gate without one); `probes` the primary law against finished
    runs beyond the ladder (`gate_probes`; no gate without any); `probe_correction` whether `final`
    is the primary law corrected by the probes' trend, carried by `probe_carry`; `recipe_check` a
    `delphi ladder recipe-check` report (`gate_recipe`; no gate without one); `external`: the table
    is not a Delphi ladder's (module docstring: what is not applicable)."""

    fit: Any
    table: pd.DataFrame | None
    final: dict
    hero: dict[str, float]
    backtest: dict | None = None
    lobo: dict | None = None
    ranges: dict[str, tuple[float, float]] | None = None
    range_scopes: dict[str, str] | None = None
    trained_ranges: dict[str, tuple[float, float]] | None = None
    rehearsal: dict | None = None
    cross_checks: dict[str, dict] | None = None
    exact_required: bool | None = None
    lr_drift: list[dict] | None = None
    probes: dict[str, dict] | None = None
    probe_correction: bool = False
    probe_carry: str = "linear"
    recipe_check: dict | None = None
    external: bool = False


def evaluate_gates(inputs: GateInputs, thresholds: GateThresholds) -> list[Gate]:
    """Every gate, in a fixed order (GATE_NAMES), judged on `inputs` under `thresholds`."""
    fit, table, final, hero = inputs.fit, inputs.table, inputs.final, inputs.hero
    agreement = gate_method_agreement(float(final["loss"]), inputs.cross_checks, thresholds.tol("agreement"))
    exact_required = inputs.exact_required
    if exact_required is None:  # laws in C are fitted on each budget's real cost; only (N, D) laws allocate
        exact_required = getattr(fit, "family", None) is not None and bool(getattr(fit, "law_in_nd", False))
    backtest = gate_backtest(inputs.backtest, thresholds.tol("backtest"), exact_required=exact_required)
    lobo = gate_lobo_spread(inputs.lobo, float(final["loss"]), thresholds.tol("lobo"))
    width = gate_interval_width(final, thresholds.tolerance_rel, thresholds.interval_width_factor)
    if table is None or len(table) == 0:
        missing = "not evaluated: no results table (give --ladder or --results)"
        gates = [
            Gate(name, False, None, "needs the results table", missing)
            for name in ("isoflop_vertices", "frontier_slopes", "rung_health", "seeds", "hero_ranges", "hero_depth")
        ]
        gates[1:1] = [backtest, lobo, width]
        gates += [agreement, gate_fit_status(fit)]
        probes = (
            gate_probes(
                inputs.probes, thresholds.tol("rehearsal"), corrected=inputs.probe_correction, carry=inputs.probe_carry
            )
            if inputs.probes
            else None
        )
    else:
        gates = [
            gate_isoflop_vertices(table),
            backtest,
            lobo,
            width,
            _frontier_gate(table, fit, final, thresholds.trend_z, inputs.external),
            gate_rung_health(table, inputs.external),
            gate_seeds(table, thresholds.min_seeds, inputs.external),
            gate_hero_ranges(
                hero,
                inputs.ranges if inputs.ranges is not None else ladder_ranges(table),
                thresholds.range_slack_rel,
                inputs.external,
                inputs.range_scopes,
                inputs.trained_ranges,
            ),
            gate_hero_depth(
                table,
                None if "n_layers" not in hero else int(hero["n_layers"]),
                HERO_MAX_OFF_OPTIMUM,
                inputs.external,
            ),
            agreement,
            gate_fit_status(fit),
        ]
        probes = (
            gate_probes(
                inputs.probes,
                thresholds.tol("rehearsal"),
                top_budget=ladder_top_budget(table),
                hero_compute=hero.get("flops"),
                corrected=inputs.probe_correction,
                carry=inputs.probe_carry,
            )
            if inputs.probes
            else None
        )
    if inputs.rehearsal is not None:
        gates.append(gate_dress_rehearsal(inputs.rehearsal, thresholds.tol("rehearsal")))
    if probes is not None:
        gates.append(probes)
    if inputs.lr_drift is not None:
        gates.append(gate_lr_transfer(inputs.lr_drift, hero, thresholds.tolerance_rel))
    if inputs.recipe_check is not None:
        gates.append(gate_recipe(inputs.recipe_check, hero))
    return gates


def _frontier_gate(table: pd.DataFrame, fit: Any, final: dict, z: float, external: bool) -> Gate:
    """Gate frontier_slopes with the fit's seed noise (else the table's pooled one); on an external
    table without seeds, the law's residual scatter about the table is the noise it shows."""
    noise = (getattr(fit, "diagnostics", None) or FitDiagnostics()).seed_noise_nats
    noise = float(noise) if isinstance(noise, (int, float)) and math.isfinite(noise) else pooled_seed_noise(table)
    noise_note = ""
    scatter = final.get("residual_scatter_nats")
    if external and noise is None and isinstance(scatter, (int, float)) and math.isfinite(scatter):
        noise, noise_note = (
            float(scatter),
            f"; noise per point: the law's residual scatter {float(scatter):.4f} nats (no seeds)",
        )
    params = getattr(fit, "params", None) or {}
    e = float(params.get("E", 0.0))  # laws without an asymptote (isoflop) have no E: slopes of ln L
    try:
        gate = gate_frontier_slopes(frontier_slopes(table, noise, e), z)
        return replace(gate, detail=gate.detail + noise_note) if noise_note else gate
    except DelphiError as err:
        return Gate("frontier_slopes", False, None, f"no monotone trend beyond {z:.3g} standard errors", str(err))


def gate_report(gates: list[Gate], *, forced: bool, thresholds: GateThresholds | None = None) -> dict[str, Any]:
    out = {
        "passed": all_passed(gates),
        "forced": bool(forced),
        "failed": failed_names(gates),
        "gates": [g.to_json() for g in gates],
    }
    if not_applicable_names(gates):
        out["not_applicable"] = not_applicable_names(gates)
    if thresholds is not None:
        out["thresholds"] = asdict(thresholds)
    return out


def _value_text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def gate_table(gates: Iterable[Gate | dict]) -> str:
    """Markdown table of gates (objects or their JSON)."""
    rows = ["| gate | result | value | threshold | detail |", "|---|---|---|---|---|"]
    for g in gates:
        g = g if isinstance(g, Gate) else Gate.from_json(g)
        cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731  (a '|' inside a cell ends it)
        rows.append(
            f"| {g.name} | {g.result} | {cell(_value_text(g.value))} | {cell(g.threshold)} | {cell(g.detail)} |"
        )
    return "\n".join(rows)


def gate_lines(gates: Iterable[Gate]) -> list[str]:
    """One line per gate for a terminal: PASS/FAIL/N/A name: detail."""
    return [f"{g.result} {g.name}: {g.detail}" for g in gates]
