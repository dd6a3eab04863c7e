"""The default study's hero at its batch and at half of it, ten seeds each
(benchmarks/law_miss/PREDICTIONS_DEFAULT_HALF_BATCH.md says what each hypothesis predicts).

The default study's hero, like the eighth edition's 30x run, trains at twice the largest batch its
ladder's top budget trained: under a recipe the batch grows with the run's tokens (gate hero_ranges
names the distance). The half-batch config is `half_batch.half_batch`: same model, tokens and
schedule shape, twice the steps, the recipe's hyperparameters at half the batch. Seed k sets both
the init seed and the data seed to k, as a study's seeds do. Each batch's ten seeds train as one
vmapped program (delphi.train.trainer.train_group).

    delphi study --out /tmp/ds4/study      # a default study: its hero.yaml and ladder/ladder.yaml
    python benchmarks/law_miss/half_batch_default.py train --study /tmp/ds4/study --runs /tmp/hb_default
    python benchmarks/law_miss/half_batch_default.py collect --runs /tmp/hb_default --out benchmarks/law_miss

`--rung RUN_ID` does the same for one of the ladder's rungs (its seed-0 config,
ladder/configs/RUN_ID.yaml) instead of the hero; collect then writes default_half_batch_RUN_ID.*.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import pandas as pd
from scipy.stats import t as t_dist

from delphi.io import atomic_write_json
from delphi.train.config import TrainConfig, load_train_config
from delphi.train.trainer import train_group

sys.path.insert(0, str(Path(__file__).resolve().parent))
from half_batch import half_batch  # noqa: E402

SEEDS = tuple(range(10))


def seeded(cfg: TrainConfig, seed: int, name: str) -> TrainConfig:
    return dataclasses.replace(cfg, seed=seed, data=dataclasses.replace(cfg.data, seed=seed), name=name)


def target_config(study: Path, rung: str | None) -> TrainConfig:
    """The study's hero, or one of its ladder's rungs."""
    return load_train_config(study / "hero.yaml" if rung is None else study / "ladder" / "configs" / f"{rung}.yaml")


def train(study: Path, runs: Path, rung: str | None) -> None:
    target = target_config(study, rung)
    for label, cfg in (("full", target), ("half", half_batch(target, study / "ladder" / "ladder.yaml"))):
        names = [f"{label}_s{seed}" for seed in SEEDS]
        todo = [(n, seeded(cfg, s, n)) for n, s in zip(names, SEEDS) if not (runs / n / "summary.json").is_file()]
        o = cfg.optim
        print(
            f"{label}: batch {cfg.data.batch_size} x {cfg.steps} steps, lr {o.lr:.4g}, adam_lr {o.adam_lr:.4g}, "
            f"beta2 {o.beta2:.5f}; {len(todo)} seeds to train",
            flush=True,
        )
        if todo:
            train_group([c for _, c in todo], [runs / n for n, _ in todo], progress=False)


def collect(runs: Path, out: Path, rung: str | None) -> None:
    stem = "default_half_batch" if rung is None else f"default_half_batch_{rung}"
    rows = []
    for run in sorted(p for p in runs.iterdir() if (p / "summary.json").is_file()):
        summary = json.loads((run / "summary.json").read_text())
        cfg = load_train_config(run / "config.yaml")
        label, seed = run.name.split("_s")
        rows.append(
            {
                "run": label,
                "seed": int(seed),
                "batch_size": cfg.data.batch_size,
                "steps": cfg.steps,
                "tokens": cfg.tokens,
                "lr": cfg.optim.lr,
                "beta2": cfg.optim.beta2,
                "loss": summary["val_loss"],
                "data_sha256": summary["data_sha256"],
            }
        )
    table = pd.DataFrame(rows).sort_values(["run", "seed"])
    table.to_csv(out / f"{stem}.csv", index=False, float_format="%.10g")
    wide = table.pivot(index="seed", columns="run", values="loss").dropna()
    drop = 1 - wide["half"] / wide["full"]  # > 0: the half batch ends lower
    n, mean, sd = len(drop), float(drop.mean()), float(drop.std(ddof=1))
    half_width = float(t_dist.ppf(0.95, n - 1)) * sd / math.sqrt(n)
    summary = {
        "source": "benchmarks/law_miss/half_batch_default.py collect",
        "target": rung or "hero",
        "n_seeds": n,
        "drop_mean": mean,
        "drop_sd": sd,
        "drop_90": [mean - half_width, mean + half_width],
        "drops": {int(s): float(d) for s, d in drop.items()},
        "loss_mean": {k: float(wide[k].mean()) for k in ("full", "half")},
        "loss_sd_rel": {k: float(wide[k].std(ddof=1) / wide[k].mean()) for k in ("full", "half")},
    }
    atomic_write_json(out / f"{stem}.json", summary)
    print(table.to_string(index=False))
    print(
        f"drop (full - half) / full over {n} seeds: mean {100 * mean:+.2f}%, sd {100 * sd:.2f}%, "
        f"90% [{100 * summary['drop_90'][0]:+.2f}%, {100 * summary['drop_90'][1]:+.2f}%]"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["train", "collect"])
    parser.add_argument("--study", type=Path, help="a default study's output directory (train)")
    parser.add_argument("--runs", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--rung", help="a rung's run id (its seed-0 config) instead of the hero")
    args = parser.parse_args()
    if args.command == "train":
        if args.study is None:
            raise SystemExit("train: --study is required (a default study's output directory)")
        train(args.study, args.runs, args.rung)
    else:
        collect(args.runs, args.out, args.rung)


if __name__ == "__main__":
    main()
