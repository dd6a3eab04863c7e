"""Crossed seeds on one ladder cell: init seed x data seed, to separate what makes two seeds differ.

A rung of the eighth edition's ladder sets `seed` (parameter init) and `data.seed` (the batch at step s
is a pure function of (data.seed, s)) both to the rung's seed. This script trains one cell's config
with every pair (init, data) from two lists, optionally under a lever (a lower peak LR, ...), and
collects the finals and the curves into compact tables.

    # the rung configs, byte for byte the edition's (docs/cli.md: ladder plan)
    delphi ladder plan studies/ladder_paper_v8.yaml --out /tmp/seeds/plan
    python benchmarks/seed_noise/crossed.py train --plan /tmp/seeds/plan --cell C5.2e10_d28_L3_E8k2 \
        --inits 0,1,2 --datas 0,1,2 --runs /tmp/seeds/runs
    python benchmarks/seed_noise/crossed.py collect --runs /tmp/seeds/runs --out benchmarks/seed_noise

    # a run that is no ladder cell: the 3x probe's config, the edition's two (init, data) pairs
    delphi paper unpack paper/editions/v8 --to /tmp/seeds/v8
    python benchmarks/seed_noise/crossed.py train --config /tmp/seeds/v8/study/probes/probe3x/config.yaml \
        --cell probe3x --pairs 0:0,1:1 --runs /tmp/seeds/runs

`--group` trains the pairs as one vmapped program (delphi.train.trainer.train_group): one compile
for all of them. The eval set is fixed (delphi.data.loader: evenly spread validation windows, the same
for every run on a store), so a final loss is a function of the trained weights alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import f as f_dist

from delphi.io import atomic_write_json
from delphi.train.config import TrainConfig, load_train_config
from delphi.train.schedules import decay_steps
from delphi.train.trainer import train, train_group

LEVERS = {
    "base": "the edition's config",
    "lr0.5": "peak LR (optim.lr and optim.adam_lr) x 0.5",
    "decay0.5": "WSD decay over the last 50% of steps instead of 20%",
}


def lever_config(cfg: TrainConfig, lever: str) -> TrainConfig:
    """`cfg` with one lever applied (LEVERS)."""
    optim = cfg.optim
    if lever == "base":
        return cfg
    if lever == "lr0.5":
        adam_lr = None if optim.adam_lr is None else optim.adam_lr * 0.5
        return dataclasses.replace(cfg, optim=dataclasses.replace(optim, lr=optim.lr * 0.5, adam_lr=adam_lr))
    if lever == "decay0.5":
        return dataclasses.replace(cfg, optim=dataclasses.replace(optim, decay_frac=0.5))
    raise SystemExit(f"--lever: {lever!r} is not one of {', '.join(LEVERS)}")


def run_name(cell: str, lever: str, init_seed: int, data_seed: int) -> str:
    return f"{cell}__{lever}__i{init_seed}_d{data_seed}"


def pairs_config(
    base: TrainConfig, cell: str, lever: str, pairs: list[tuple[int, int]]
) -> list[tuple[str, TrainConfig]]:
    cfg = lever_config(base, lever)
    out = []
    for init_seed, data_seed in pairs:
        name = run_name(cell, lever, init_seed, data_seed)
        member = dataclasses.replace(cfg, seed=init_seed, data=dataclasses.replace(cfg.data, seed=data_seed), name=name)
        out.append((name, member))
    return out


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """`0:0,1:1` -> [(0, 0), (1, 1)] (init seed : data seed)."""
    try:
        return [(int(i), int(d)) for i, d in (item.split(":") for item in text.split(","))]
    except ValueError:
        raise SystemExit(f"--pairs: expected INIT:DATA[,INIT:DATA...], got {text!r}") from None


def cmd_train(args: argparse.Namespace) -> None:
    if (args.plan is None) == (args.config is None):
        raise SystemExit("train: give one of --plan (with a ladder cell) or --config (a train config file)")
    config = Path(args.config) if args.config else Path(args.plan) / "configs" / f"{args.cell}_s0.yaml"
    base = load_train_config(config)
    if args.pairs:
        pairs = parse_pairs(args.pairs)
    else:
        pairs = [(int(i), int(d)) for i in args.inits.split(",") for d in args.datas.split(",")]
    runs = Path(args.runs)
    todo = [
        (name, cfg)
        for name, cfg in pairs_config(base, args.cell, args.lever, pairs)
        if not (runs / name / "summary.json").is_file()
    ]
    if args.group and todo:
        train_group([c for _, c in todo], [runs / n for n, _ in todo], progress=False)
        return
    for name, cfg in todo:
        summary = train(cfg, runs / name, progress=False)
        print(f"{name}: {summary['status']} val_loss_final_set {summary['val_loss']:.6f}", file=sys.stderr, flush=True)


def parse_name(name: str) -> tuple[str, str, int, int]:
    cell, lever, seeds = name.split("__")
    i, d = seeds.split("_")
    return cell, lever, int(i[1:]), int(d[1:])


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


CURVE_KEYS = ("step", "tokens", "lr", "train_loss", "grad_norm", "load_max_over_mean", "router_entropy", "val_loss")


def cmd_collect(args: argparse.Namespace) -> None:
    rows, curves = [], []
    for run_dir in sorted(Path(args.runs).iterdir()):
        if "__" not in run_dir.name or not (run_dir / "summary.json").is_file():
            continue
        cell, lever, init_seed, data_seed = parse_name(run_dir.name)
        summary = json.loads((run_dir / "summary.json").read_text())
        records = read_metrics(run_dir / "metrics.jsonl")
        last = records[-1]
        train_losses = [r["train_loss"] for r in records if "train_loss" in r]
        grad_norms = [r["grad_norm"] for r in records if "grad_norm" in r]
        rows.append(
            {
                "cell": cell,
                "lever": lever,
                "init_seed": init_seed,
                "data_seed": data_seed,
                "status": summary["status"],
                "steps": summary["steps"],
                "loss": summary["val_loss"],  # the final set (final_eval_tokens), the number a fit reads
                "loss_eval_set": last.get("val_loss"),  # chunk 0 of the final set: the regular 131k-token eval
                "max_train_loss_late": max(train_losses[len(train_losses) // 2 :]),
                "max_grad_norm": max(grad_norms),
                "decay_start_step": decay_start_step(load_train_config(run_dir / "config.yaml")),
                "data_sha256": summary["data_sha256"],
                "config_sha256": summary["config_sha256"],
            }
        )
        for r in records:
            row = {"run": run_dir.name} | {k: r.get(k) for k in CURVE_KEYS}
            curves.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows)
    table.to_csv(out / "results.csv", index=False, float_format="%.9g")
    with gzip.open(out / "curves.csv.gz", "wt") as f:
        pd.DataFrame(curves).to_csv(f, index=False, float_format="%.9g")
    print(summarise(table))


def decay_start_step(cfg: TrainConfig) -> int:
    """The first step of the WSD decay."""
    return cfg.steps - decay_steps(cfg.optim, cfg.steps)


def pair_gaps(t: pd.DataFrame, curves: pd.DataFrame) -> dict:
    """A cell of two runs: the second run's loss over the first's - 1 (runs ordered by init seed) at
    every eval on the regular eval set and on the final set, and the largest gap before the decay."""
    first, second = (
        run_name(r.cell, r.lever, r.init_seed, r.data_seed) for r in t.sort_values("init_seed").itertuples()
    )
    pair = curves[curves.run.isin([first, second]) & curves.val_loss.notna()]
    evals = pair.pivot(index="step", columns="run", values="val_loss")
    gaps = evals[second] / evals[first] - 1
    before = gaps[gaps.index < int(t.decay_start_step.iloc[0])]
    final = t.set_index("init_seed").sort_index().loss
    return {
        "pair": [first, second],
        "decay_start_step": int(t.decay_start_step.iloc[0]),
        "gap_by_step": {int(step): float(g) for step, g in gaps.items()},
        "max_abs_gap_before_decay": float(before.abs().max()),
        "gap_final_set": float(final.iloc[1] / final.iloc[0] - 1),
    }


def cmd_summary(args: argparse.Namespace) -> None:
    table = pd.read_csv(Path(args.out) / "results.csv")
    write_summary_json(table, Path(args.out) / SUMMARY_FILE, pd.read_csv(Path(args.out) / "curves.csv.gz"))
    print(summarise(table))


SUMMARY_FILE = "summary.json"  # the numbers of `summarise` per cell and lever, for the paper's text
EDITION = "v8"  # the edition whose ladder cells are crossed (studies/ladder_paper_v8.yaml)


def cell_stats(t: pd.DataFrame) -> dict:
    """One cell and lever: the mean, the sd over all pairs, and, for a full init x data table, a
    two-way split of the variance into init (row means), data (column means) and what neither
    explains alone (interaction), with each factor's F against the interaction."""
    grand, sd = float(t.loss.mean()), float(t.loss.std(ddof=1))
    stats = {"n": len(t), "mean": grand, "sd": sd, "sd_rel": sd / grand}
    wide = t.pivot(index="init_seed", columns="data_seed", values="loss")
    if wide.shape[0] > 1 and wide.shape[1] > 1 and not wide.isna().any().any():
        r, c = wide.shape
        row_eff = wide.mean(axis=1) - grand
        col_eff = wide.mean(axis=0) - grand
        resid = wide.sub(row_eff, axis=0).sub(col_eff, axis=1) - grand
        ms_init = c * (row_eff**2).sum() / (r - 1)
        ms_data = r * (col_eff**2).sum() / (c - 1)
        ms_resid = (resid**2).to_numpy().sum() / ((r - 1) * (c - 1))
        f_init, f_data = ms_init / ms_resid, ms_data / ms_resid
        stats |= {
            "ms_init": ms_init,
            "ms_data": ms_data,
            "ms_interaction": ms_resid,
            "df_init": r - 1,
            "df_data": c - 1,
            "df_interaction": (r - 1) * (c - 1),
            # variance components (method of moments, floored at 0)
            "sd_init": math.sqrt(max(0.0, (ms_init - ms_resid) / c)),
            "sd_data": math.sqrt(max(0.0, (ms_data - ms_resid) / r)),
            "sd_interaction": math.sqrt(ms_resid),
            "f_init": f_init,
            "p_init": float(f_dist.sf(f_init, r - 1, (r - 1) * (c - 1))),
            "f_data": f_data,
            "p_data": float(f_dist.sf(f_data, c - 1, (r - 1) * (c - 1))),
        }
    return stats


def write_summary_json(table: pd.DataFrame, path: Path, curves: pd.DataFrame) -> None:
    cells = [
        {"cell": cell, "lever": lever, **cell_stats(t), **(pair_gaps(t, curves) if len(t) == 2 else {})}
        for (cell, lever), t in table.groupby(["cell", "lever"])
    ]
    crossed = [c for c in cells if c["lever"] == "base" and "f_init" in c]
    pooled = {}
    if crossed:  # the cells' mean squares averaged (the cells have equal df)
        ms = {k: float(np.mean([c[k] for c in crossed])) for k in ("ms_init", "ms_data", "ms_interaction")}
        df = {k: sum(c[k] for c in crossed) for k in ("df_init", "df_data", "df_interaction")}
        f_init, f_data = ms["ms_init"] / ms["ms_interaction"], ms["ms_data"] / ms["ms_interaction"]
        pooled = {
            "cells": len(crossed),
            "f_init": f_init,
            "p_init": float(f_dist.sf(f_init, df["df_init"], df["df_interaction"])),
            "f_data": f_data,
            "p_data": float(f_dist.sf(f_data, df["df_data"], df["df_interaction"])),
        }
    atomic_write_json(
        path,
        {"source": "benchmarks/seed_noise/crossed.py summary", "edition": EDITION, "cells": cells, "pooled": pooled},
    )


def summarise(table: pd.DataFrame) -> str:
    """Per cell and lever: `cell_stats` as text, the table of finals and the eval and outlier checks."""
    lines = []
    for (cell, lever), t in table.groupby(["cell", "lever"]):
        st = cell_stats(t)
        lines.append(f"{cell} {lever}: n={st['n']} mean {st['mean']:.4f} sd {st['sd']:.4f} ({100 * st['sd_rel']:.2f}%)")
        if "f_init" in st:
            lines.append(
                f"  MS init {st['ms_init']:.3g}  MS data {st['ms_data']:.3g}  MS interaction {st['ms_interaction']:.3g}; "
                f"sd components: init {st['sd_init']:.4f}  data {st['sd_data']:.4f}  "
                f"interaction {st['sd_interaction']:.4f}"
            )
            lines.append(
                f"  F init {st['f_init']:.2f} (p {st['p_init']:.3f})  F data {st['f_data']:.2f} (p {st['p_data']:.3f})"
            )
            wide = t.pivot(index="init_seed", columns="data_seed", values="loss")
            lines.append("  " + wide.round(4).to_string().replace("\n", "\n  "))
        lines.append(f"  {eval_and_outliers(t)}")
    return "\n".join(lines)


def eval_and_outliers(t: pd.DataFrame) -> str:
    """The spread on the regular eval set (chunk 0) beside the final set's, their correlation over
    the runs, and each run's distance from the others' mean in their sd (the largest named)."""
    corr = float(np.corrcoef(t.loss, t.loss_eval_set)[0, 1]) if len(t) > 2 else float("nan")
    chunk_sd = 100 * t.loss_eval_set.std(ddof=1) / t.loss_eval_set.mean()
    z = {}
    for idx, row in t.iterrows():
        others = t.loss.drop(idx)
        z[f"i{row.init_seed}_d{row.data_seed}"] = (row.loss - others.mean()) / others.std(ddof=1)
    worst = max(z, key=lambda k: abs(z[k])) if len(t) > 2 else None
    without = t.loss.drop(t.index[list(z).index(worst)]) if worst else t.loss
    return (
        f"chunk-0 sd {chunk_sd:.2f}% (corr with final {corr:.4f}); largest outlier {worst} "
        f"z {z.get(worst, float('nan')):+.2f}; sd without it {100 * without.std(ddof=1) / without.mean():.2f}%"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--plan", help="a `delphi ladder plan` output directory (the cell's seed-0 config)")
    t.add_argument("--config", help="a train config file, instead of --plan; --cell then names its runs")
    t.add_argument("--cell", required=True, help="a cell id, e.g. C5.2e10_d28_L3_E8k2")
    t.add_argument("--inits", default="0,1,2")
    t.add_argument("--datas", default="0,1,2")
    t.add_argument("--pairs", help="INIT:DATA[,...] pairs to train instead of every --inits x --datas pair")
    t.add_argument("--lever", default="base", choices=sorted(LEVERS))
    t.add_argument("--runs", required=True)
    t.add_argument("--group", action="store_true", help="train the pairs as one vmapped program")
    c = sub.add_parser("collect")
    c.add_argument("--runs", required=True)
    c.add_argument("--out", required=True)
    s = sub.add_parser("summary", help="the summary of a collected results.csv")
    s.add_argument("--out", required=True, help="the directory collect wrote")
    args = parser.parse_args()
    {"train": cmd_train, "collect": cmd_collect, "summary": cmd_summary}[args.command](args)


if __name__ == "__main__":
    main()
