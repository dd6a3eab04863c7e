"""How far the ladder's own seed noise moves the eighth edition's predictions beyond it, and whether the
law's residuals trend with tokens (benchmarks/law_miss/PREDICTIONS.md, experiments A and B).

A "one-seed ladder" keeps one seed per cell of the edition's results table. Across random choices, a
2-seed cell's value varies with variance sigma^2 / 2, the variance of the 2-seed mean the study fitted
to. So the sd of a law's prediction across choices estimates what the ladder's seed noise puts on the
study's own prediction. Each law is refitted as the study fitted it and predicts each sealed run at
its exact N, D and FLOPs, with the code a seal runs.

    python benchmarks/law_miss/seed_choice.py run --out benchmarks/law_miss      # ~2 min on 2 cores
    python benchmarks/law_miss/seed_choice.py summary --out benchmarks/law_miss
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from delphi.editions import resolve_data
from delphi.io import atomic_write_json
from delphi.paper.study_data import study_view
from delphi.prereg.predict import predict_hero
from delphi.study.fitting import fit_one
from delphi.study.state import load_table
from delphi.train.config import load_train_config

REPO = Path(__file__).resolve().parents[2]
EDITION = "v8"
EDITION_STUDY = REPO / "paper" / "editions" / EDITION / "study"
LAWS = ("vpnls", "parametric", "asymptotic")  # the primary first
# run name -> (its train config inside the study, its outcome file: the two-seed mean it scored)
RUNS = {
    "3x": ("probes/probe3x.yaml", "preregistrations/paper-v8-probe-3x.outcome.json"),
    "10x": ("probes/probe10x.yaml", "preregistrations/paper-v8-probe-10x.outcome.json"),
    "30x": ("hero.yaml", "preregistrations/paper-v8-hero-30x.outcome.json"),
}
N_CHOICES = 400
CHOICE_SEED = 0
TOP_BUDGETS = (1.7e12, 4.2e12, 1.0e13)  # experiment B's budgets


def one_seed_choices(table: pd.DataFrame, n: int, seed: int) -> list[tuple[str, pd.Series]]:
    """Row masks that keep one seed per cell: every cell's seed 0, every cell's seed 1, then `n`
    random choices."""
    cells = table.groupby("cell_id")["seed"].apply(sorted)
    rng = np.random.default_rng(seed)
    choices = [("all_seed0", {c: 0 for c in cells.index}), ("all_seed1", {c: 1 for c in cells.index})]
    for i in range(n):
        choices.append((f"random{i:03d}", {c: int(rng.choice(s)) for c, s in cells.items()}))
    return [(name, table["seed"] == table["cell_id"].map(pick)) for name, pick in choices]


def predictions(study, table: pd.DataFrame, configs: dict) -> dict[tuple[str, str], float]:
    """Each law's prediction at each run, refitted on `table` as the study fitted it."""
    out = {}
    for law in LAWS:
        fit = fit_one(study, law, table, 0)
        for run, cfg in configs.items():
            out[(law, run)] = float(predict_hero(fit, cfg)[0]["loss"])
    return out


def run(out: Path) -> None:
    data = resolve_data(EDITION_STUDY)
    study = study_view(data, out / "figures_unused")
    table = load_table(study)
    configs = {run: load_train_config(data / path) for run, (path, _) in RUNS.items()}
    actual = {run: json.loads((REPO / outcome).read_text())["actual_final_loss"] for run, (_, outcome) in RUNS.items()}
    rows = []
    for name, mask in [("full", table["seed"] >= 0), *one_seed_choices(table, N_CHOICES, CHOICE_SEED)]:
        for (law, run), predicted in predictions(study, table[mask], configs).items():
            rows.append({"choice": name, "law": law, "run": run, "predicted": predicted, "actual": actual[run]})
    frame = pd.DataFrame(rows)
    frame["rel_error"] = frame["actual"] / frame["predicted"] - 1
    frame.to_csv(out / "choices.csv", index=False, float_format="%.10g")
    residuals(study, table).to_csv(out / "residuals.csv", index=False, float_format="%.10g")


def residuals(study, table: pd.DataFrame) -> pd.DataFrame:
    """Experiment B: each top-budget cell's mean loss against the full-ladder VPNLS fit."""
    fit = fit_one(study, "vpnls", table, 0)
    cells = (
        table[table["budget"].isin(TOP_BUDGETS)]
        .groupby("cell_id")
        .agg(
            budget=("budget", "first"),
            params=("params", "first"),
            tokens=("tokens", "first"),
            flops=("flops", "first"),
            experts=("experts", "first"),
            granularity=("granularity", "first"),
            loss=("loss", "mean"),
        )
        .reset_index()
    )
    cells["fitted"] = [
        float(
            fit.predict_run(
                params=r.params, tokens=r.tokens, flops=r.flops, experts=r.experts, granularity=r.granularity
            )["loss"]
        )
        for r in cells.itertuples()
    ]
    cells["residual_rel"] = cells["loss"] / cells["fitted"] - 1
    return cells.sort_values(["budget", "tokens"])


SUMMARY_FILE = "summary.json"  # the numbers `summary` prints, for the paper's text


def law_miss_stats(out: Path) -> dict:
    """Every number of experiments A and B (and the swing found after A) from choices.csv and
    residuals.csv."""
    frame = pd.read_csv(out / "choices.csv")
    full = frame[frame["choice"] == "full"].set_index(["law", "run"])
    chosen = frame[frame["choice"].str.startswith("random")]
    laws = {}
    for law in LAWS:
        errors = chosen[chosen["law"] == law].pivot(index="choice", columns="run", values="rel_error")
        predicted = chosen[chosen["law"] == law].pivot(index="choice", columns="run", values="predicted")
        fixed = frame[(frame["law"] == law) & frame["choice"].str.startswith("all_seed")]
        laws[law] = {
            run: {
                "predicted": full.loc[(law, run), "predicted"],
                "rel_error": full.loc[(law, run), "rel_error"],
                "sd_rel": predicted[run].std(ddof=1) / full.loc[(law, run), "predicted"],
                "error_q025": errors[run].quantile(0.025),
                "error_q975": errors[run].quantile(0.975),
                "share_predicting_low": float((errors[run] > 0).mean()),
                "seed0_ladder_error": fixed[(fixed["run"] == run) & (fixed["choice"] == "all_seed0")][
                    "rel_error"
                ].item(),
                "seed1_ladder_error": fixed[(fixed["run"] == run) & (fixed["choice"] == "all_seed1")][
                    "rel_error"
                ].item(),
            }
            for run in RUNS
        } | {
            "corr_10x_30x": errors["10x"].corr(errors["30x"]),
            "corr_3x_30x": errors["3x"].corr(errors["30x"]),
            "swing_30x_minus_10x": full.loc[(law, "30x"), "rel_error"] - full.loc[(law, "10x"), "rel_error"],
            "swing_sd_ladder": (errors["30x"] - errors["10x"]).std(ddof=1),
        }
    seeds = {
        run: [s["actual_final_loss"] for s in json.loads((REPO / o).read_text())["seeds"]]
        for run, (_, o) in RUNS.items()
    }
    pooled = float(np.sqrt(np.mean([np.var(v, ddof=1) / np.mean(v) ** 2 for v in seeds.values()])))
    primary = laws[LAWS[0]]
    swing_sd = float(np.hypot(pooled, primary["swing_sd_ladder"]))
    swing_t = primary["swing_30x_minus_10x"] / swing_sd
    wide = chosen[chosen["run"] == "30x"].pivot(index="choice", columns="law", values="predicted")
    cells = pd.read_csv(out / "residuals.csv")
    slope, lo, hi = _slope_interval(np.log(cells["tokens"]), cells["residual_rel"])
    data = resolve_data(EDITION_STUDY)
    hero_tokens = load_train_config(data / RUNS["30x"][0]).tokens
    at_hero = np.polyval(np.polyfit(np.log(cells["tokens"]), cells["residual_rel"], 1), np.log(hero_tokens))
    richest = cells.loc[cells.groupby("budget")["tokens"].idxmax()]
    batch = {run: load_train_config(data / path).data.batch_size for run, (path, _) in RUNS.items()}
    batch["ladder_max"] = int(pd.read_csv(data / "results.csv")["batch_size"].max())
    return {
        "source": "benchmarks/law_miss/seed_choice.py summary",
        "edition": EDITION,
        "n_choices": int(chosen["choice"].nunique()),
        "choice_seed": CHOICE_SEED,
        "primary": LAWS[0],
        "laws": laws,
        "corr_30x_between_laws": {f"{a}-{b}": wide[a].corr(wide[b]) for i, a in enumerate(LAWS) for b in LAWS[i + 1 :]},
        "batch_seqs": batch,
        "run_seeds": seeds,
        "run_seed_sd_pooled": pooled,
        "run_seed_sd_df": len(seeds),
        "swing_sd": swing_sd,
        "swing_sd_units": swing_t,
        "swing_p_two_sided": float(2 * stats.t.sf(abs(swing_t), len(seeds))),
        "residuals": {
            "cells": len(cells),
            "slope_per_efold": slope,
            "slope_lo90": lo,
            "slope_hi90": hi,
            "hero_tokens": hero_tokens,
            "trend_at_hero": float(at_hero),
            "richest_by_budget": {f"{b:.2g}": r for b, r in zip(richest["budget"], richest["residual_rel"])},
        },
    }


def summary(out: Path) -> None:
    st = law_miss_stats(out)
    atomic_write_json(out / SUMMARY_FILE, st)
    print(f"{st['n_choices']} random one-seed ladders (numpy seed {st['choice_seed']}) + all-seed-0 + all-seed-1")
    for law, by_run in st["laws"].items():
        for run in RUNS:
            r = by_run[run]
            print(
                f"{law:10s} {run:>3s}: full {r['predicted']:.4f} (error {100 * r['rel_error']:+.2f}%), "
                f"sd across choices {100 * r['sd_rel']:.2f}%, errors 2.5-97.5% "
                f"[{100 * r['error_q025']:+.2f}%, {100 * r['error_q975']:+.2f}%], "
                f"{100 * r['share_predicting_low']:.0f}% predict low; seed0 / seed1 ladders "
                f"{100 * r['seed0_ladder_error']:+.2f}% / {100 * r['seed1_ladder_error']:+.2f}%"
            )
    print(
        "30x prediction, correlation across choices: "
        + ", ".join(f"{k} {v:.3f}" for k, v in st["corr_30x_between_laws"].items())
    )
    print("Not sealed (found after A): the ladder's noise moves the runs together, so it cannot make opposite errors:")
    for law, r in st["laws"].items():
        print(
            f"   {law:10s} correlation across choices 10x/30x {r['corr_10x_30x']:.3f}, 3x/30x {r['corr_3x_30x']:.3f}; "
            f"30x error - 10x error {100 * r['swing_30x_minus_10x']:+.2f} points, sd across choices "
            f"{100 * r['swing_sd_ladder']:.2f}"
        )
    print(
        "   the runs' own seeds: "
        + ", ".join(f"{run} {' / '.join(f'{x:.4f}' for x in v)}" for run, v in st["run_seeds"].items())
        + f"; pooled per-run sd {100 * st['run_seed_sd_pooled']:.2f}% ({st['run_seed_sd_df']} df)"
    )
    print(
        f"   {LAWS[0]} swing {100 * st['laws'][LAWS[0]]['swing_30x_minus_10x']:+.2f} points against sd "
        f"{100 * st['swing_sd']:.2f} (the two means' noise and the ladder's): {st['swing_sd_units']:.1f} sd, "
        f"two-sided p {st['swing_p_two_sided']:.3f} on t({st['run_seed_sd_df']})"
    )
    b = st["residuals"]
    print(
        f"B: {b['cells']} top-budget cells, residual vs log tokens: slope {100 * b['slope_per_efold']:+.3f}% per "
        f"e-fold, 90% [{100 * b['slope_lo90']:+.3f}%, {100 * b['slope_hi90']:+.3f}%]; carried to the 30x hero's "
        f"{b['hero_tokens']:.3g} tokens: {100 * b['trend_at_hero']:+.2f}%; most data-rich rung per budget: "
        + ", ".join(f"{k} {100 * v:+.2f}%" for k, v in b["richest_by_budget"].items())
    )


def _slope_interval(x: pd.Series, y: pd.Series) -> tuple[float, float, float]:
    """Least-squares slope of y on x and its 90% t interval."""
    result = stats.linregress(x, y)
    half = stats.t.ppf(0.95, len(x) - 2) * result.stderr
    return result.slope, result.slope - half, result.slope + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "summary"])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "law_miss")
    args = parser.parse_args()
    if args.command == "run":
        run(args.out)
    summary(args.out)


if __name__ == "__main__":
    main()
