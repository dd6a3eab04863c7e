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

from delphi.editions import resolve_data
from delphi.paper.study_data import study_view
from delphi.prereg.predict import predict_hero
from delphi.study.fitting import fit_one
from delphi.study.state import load_table
from delphi.train.config import load_train_config

REPO = Path(__file__).resolve().parents[2]
EDITION_STUDY = REPO / "paper" / "editions" / "v8" / "study"
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


def summary(out: Path) -> None:
    frame = pd.read_csv(out / "choices.csv")
    full = frame[frame["choice"] == "full"].set_index(["law", "run"])
    chosen = frame[frame["choice"].str.startswith("random")]
    print(f"{chosen['choice'].nunique()} random one-seed ladders (numpy seed {CHOICE_SEED}) + all-seed-0 + all-seed-1")
    for law in LAWS:
        for run in RUNS:
            p = chosen[(chosen["law"] == law) & (chosen["run"] == run)]
            f = full.loc[(law, run)]
            sd_rel = p["predicted"].std(ddof=1) / f["predicted"]
            err = p["rel_error"]
            fixed = frame[(frame["law"] == law) & (frame["run"] == run) & frame["choice"].str.startswith("all_seed")]
            share_low = (err > 0).mean()  # choices whose prediction is below the actual
            print(
                f"{law:10s} {run:>3s}: full {f['predicted']:.4f} (error {100 * f['rel_error']:+.2f}%), "
                f"sd across choices {100 * sd_rel:.2f}%, errors 2.5-97.5% "
                f"[{100 * err.quantile(0.025):+.2f}%, {100 * err.quantile(0.975):+.2f}%], "
                f"{100 * share_low:.0f}% predict low; seed0 / seed1 ladders "
                + " / ".join(f"{100 * e:+.2f}%" for e in fixed["rel_error"])
            )
    wide = chosen[chosen["run"] == "30x"].pivot(index="choice", columns="law", values="predicted")
    print("30x prediction, correlation across choices:")
    print(wide.corr().round(3).to_string())
    cells = pd.read_csv(out / "residuals.csv")
    slope, lo, hi = _slope_interval(np.log(cells["tokens"]), cells["residual_rel"])
    print(
        f"B: {len(cells)} top-budget cells, residual vs log tokens: slope {100 * slope:+.3f}% per e-fold, "
        f"90% [{100 * lo:+.3f}%, {100 * hi:+.3f}%]"
    )
    for budget, t in cells.groupby("budget"):
        richest = t.loc[t["tokens"].idxmax()]
        print(f"   {budget:.2g}: most tokens {richest['cell_id']} residual {100 * richest['residual_rel']:+.2f}%")


def _slope_interval(x: pd.Series, y: pd.Series) -> tuple[float, float, float]:
    """Least-squares slope of y on x and its 90% t interval."""
    from scipy import stats

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
