"""The study's laws on its results table: each fitted, the primary law and the parameter-count
convention chosen, a run sized from the primary fit, and the sentences a seal says about them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from delphi.errors import DelphiError
from delphi.fits import FITTERS, backtest
from delphi.fits.isoflop import isoflop_exponent_by_convention
from delphi.fits.method_choice import choose_primary
from delphi.io import atomic_write_yaml
from delphi.ladder.hero import hero_from_fit
from delphi.study.spec import AUTO_PRIMARY
from delphi.study.state import Study, chosen_convention, hero_compute, ladder_spec, load_table
from delphi.train.config import train_config_from_dict, train_config_to_dict


def fit_one(study: Study, method: str, table: pd.DataFrame, n_bootstrap: int) -> Any:
    kwargs: dict[str, Any] = {"n_bootstrap": n_bootstrap, "seed": study.spec.seed}
    if method == "frontier":
        kwargs["target_compute"] = [hero_compute(study)]
    fit = FITTERS[method](table, **kwargs)
    family = table.attrs.get("flops_family")
    return fit.with_family(family) if family is not None and hasattr(fit, "with_family") else fit


def optimal_exponent(fit: Any, compute_lo: float, compute_hi: float) -> float | None:
    """d ln N* / d ln C of the fit between two computes (under its own allocation, exact or 6ND)."""
    lo, hi = fit.predict(compute=compute_lo).get("params"), fit.predict(compute=compute_hi).get("params")
    if lo is None or hi is None or not (lo > 0 and hi > 0):
        return None
    return math.log(float(hi) / float(lo)) / math.log(compute_hi / compute_lo)


def primary_for(study: Study, table: pd.DataFrame) -> tuple[str, dict | None]:
    """The primary law on this table and, with `primary_fit: auto`, the evidence that chose it
    (delphi.fits.method_choice.choose_primary); a spec's explicit law comes with no choice."""
    if study.spec.primary_fit != AUTO_PRIMARY:
        return study.spec.primary_fit, None

    choice = choose_primary(table, study.spec.fits)
    return choice["method"], choice


def compare_conventions(study: Study) -> dict:
    """For each parameter-count convention: the isoFLOP exponent, the primary law's compute-optimal
    exponent, and its held-out-budget backtest; the convention with the lowest backtest error wins.
    With `primary_fit: auto` the primary law under each convention is the one its table's evidence picks."""
    raw = pd.read_csv(study.results)
    iso = isoflop_exponent_by_convention(raw, tuple(study.spec.conventions))
    budgets = sorted(float(b) for b in raw["budget"].unique())
    rows = {}
    for convention in study.spec.conventions:
        row: dict[str, Any] = {
            "isoflop_a": iso.get(convention, {}).get("a"),
            "isoflop_a_interval_90": iso.get(convention, {}).get("a_interval_90"),
        }
        try:
            table = load_table(study, convention)
            law, choice = primary_for(study, table)
            if choice is not None:
                row["primary_fit"] = law
            fit = fit_one(study, law, table, 0)
            row["law_a"] = optimal_exponent(fit, budgets[-1], hero_compute(study))
            row["fit_status"] = getattr(fit, "status", None)
            bt = backtest(table, lambda t: fit_one(study, law, t, 0))  # noqa: B023  (called at once, inside the loop)
            row["backtest_mean_abs_rel_error"] = bt["mean_abs_rel_error"]
            row["backtest"] = [{"budget": b["budget"], "rel_error": b["rel_error"]} for b in bt["budgets"]]
        except DelphiError as e:
            row["error"] = str(e)
        rows[convention] = row
    scored = {
        c: r["backtest_mean_abs_rel_error"] for c, r in rows.items() if r.get("backtest_mean_abs_rel_error") is not None
    }
    if study.spec.params_convention is not None:
        chosen, why = study.spec.params_convention, "set by the study spec"
    elif scored:
        chosen = min(scored, key=scored.get)
        why = f"lowest held-out-budget backtest |error| ({scored[chosen]:.2%}) of {len(scored)} conventions"
    else:
        chosen, why = "nonembedding", "no convention could be backtested; non-embedding N by default"
    return {"conventions": rows, "chosen": chosen, "why": why, "primary_fit": study.spec.primary_fit}


def sized_run(study: Study, compute: float, name: str, out: Path) -> dict:
    """Size a run at `compute` from the primary fit (exact-FLOP allocation, inside the ladder's ranges)
    and write its train config to `out`."""
    rung, details = hero_from_fit(
        study.fit_path(study.primary_fit),
        compute,
        ladder_spec(study),
        seed=study.spec.seed,
        results=pd.read_csv(study.results),
    )
    config = train_config_to_dict(rung.train) | {"name": name}
    # The rung's own events (the ladder's evals_per_run, on multiples of its step quantum) let the
    # trainer fuse several steps per call; an override of eval_every may cost that.
    if study.spec.hero.eval_every:
        config.update(eval_every=study.spec.hero.eval_every, checkpoint_every=study.spec.hero.eval_every)
    if name == "hero" and study.spec.hero.checkpoint_every_s:
        config["checkpoint_every_s"] = study.spec.hero.checkpoint_every_s
    atomic_write_yaml(out, train_config_to_dict(train_config_from_dict(config)))
    return details


def primary_choice_sentence(study: Study) -> str:
    """With `primary_fit: auto`, how the fit stage chose the primary law (the full table is in the
    study's stages/fit.json and report, and the seal's prediction.final.calibrated.method_choice);
    nothing for a spec's explicit law."""
    if study.spec.primary_fit != AUTO_PRIMARY:
        return ""
    choice = study.done("fit")["result"]["primary_choice"]
    table = "; ".join(
        f"{r['method']} {r['mean_abs_rel_error']:.2%} |error|, {r['coverage_90']:.0%} 90% coverage"
        for r in choice["table"]
    )
    return (
        f" The primary law {choice['method']} was chosen by evidence (primary_fit: auto) among "
        f"{', '.join(choice['candidates'])}: {choice['rule']} ({', '.join(s['source'] for s in choice['similar_sources'])}): "
        f"{table}."
    )


def default_rationale(study: Study) -> str:
    return (
        f"Study {study.spec.name}: the {study.primary_fit} law fitted on the ladder (N counted as "
        f"{chosen_convention(study)}, compute allocated under the family's exact FLOPs) sizes the hero "
        f"and predicts its final loss; the trajectory comes from the LR-annealing curve law fitted on the ladder's curves."
    )
