"""The eighth edition's 30x hero at its own batch and at half of it, both on this machine's store
(benchmarks/law_miss/PREDICTIONS_HALF_BATCH.md says what each hypothesis predicts).

The half-batch run keeps the hero's model, tokens, seed and schedule shape, and takes the recipe's
hyperparameters at 64 sequences instead of 128 (the recipe moves LR, Adam LR, eps and beta2 with the
batch; `delphi.ladder.recipe.recipe_for_tokens`). It trains twice the steps. The full-batch run is the
hero's config as sealed. It is trained again here because this machine's `environment` store is not
the edition's (benchmarks/seed_noise/reproduction.csv), so the edition's hero is no control.

    python benchmarks/law_miss/half_batch.py configs --out runs/law_miss      # writes full.yaml, half.yaml
    export XLA_FLAGS=--xla_cpu_multi_thread_eigen=false                        # one XLA thread per run
    taskset -c 0 delphi train runs/law_miss/full.yaml --out runs/law_miss/full   # ~2 h 50 min on one core
    taskset -c 1 delphi train runs/law_miss/half.yaml --out runs/law_miss/half   # beside it (--resume to resume)
    python benchmarks/law_miss/half_batch.py collect --runs runs/law_miss --out benchmarks/law_miss
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
from pathlib import Path

import pandas as pd

from delphi.editions import resolve_data
from delphi.io import atomic_write_yaml
from delphi.ladder.recipe import optim_config, recipe_for_tokens
from delphi.ladder.spec import load_ladder_spec
from delphi.train.config import TrainConfig, load_train_config, train_config_to_dict

REPO = Path(__file__).resolve().parents[2]
EDITION_STUDY = REPO / "paper" / "editions" / "v8" / "study"
HALF = 0.5
RUNS = ("full", "half")


def half_batch(hero: TrainConfig, ladder_spec_path: Path) -> TrainConfig:
    """The hero at half its batch: same tokens, twice the steps, the recipe's hyperparameters there.
    Checks first that the recipe gives the hero's own optimizer at the hero's batch."""
    recipe = load_ladder_spec(ladder_spec_path).recipe
    seq_len, d_model = hero.data.seq_len, hero.model.d_model
    own = optim_config(recipe_for_tokens(recipe, hero.tokens, seq_len, hero.data.batch_size, d_model))
    if own != hero.optim:
        raise SystemExit(f"the recipe does not give the hero's optimizer:\n{own}\n{hero.optim}")
    batch = int(hero.data.batch_size * HALF)
    optim = optim_config(recipe_for_tokens(recipe, hero.tokens, seq_len, batch, d_model))
    scale = int(round(1 / HALF))
    return dataclasses.replace(
        hero,
        data=dataclasses.replace(hero.data, batch_size=batch),
        optim=optim,
        steps=hero.steps * scale,
        eval_every=hero.eval_every * scale,
        checkpoint_every=hero.checkpoint_every * scale,
    )


def configs(out: Path) -> None:
    data = resolve_data(EDITION_STUDY)
    hero = load_train_config(data / "hero.yaml")
    half = half_batch(hero, data / "ladder" / "ladder.yaml")
    assert half.tokens == hero.tokens
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_yaml(out / "full.yaml", train_config_to_dict(hero))
    atomic_write_yaml(out / "half.yaml", train_config_to_dict(half))
    for name, cfg in (("full", hero), ("half", half)):
        o = cfg.optim
        print(
            f"{name}: d{cfg.model.d_model} batch {cfg.data.batch_size} x {cfg.steps} steps = {cfg.tokens:,} tokens, "
            f"lr {o.lr:.4g}, adam_lr {o.adam_lr:.4g}, beta2 {o.beta2:.5f}, eps {o.eps:.3g}"
        )


def collect(runs: Path, out: Path) -> None:
    """`half_batch.csv` (one row per run: final or last loss, steps done) and `half_batch_curves.csv.gz`
    (every metrics record of both runs)."""
    rows, curves = [], []
    for name in RUNS:
        run = runs / name
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
        cfg = load_train_config(runs / f"{name}.yaml")
        evals = [r for r in records if r.get("val_loss") is not None]
        rows.append(
            {
                "run": name,
                "batch_size": cfg.data.batch_size,
                "steps_planned": cfg.steps,
                "last_step": json.loads((run / "status.json").read_text())["step"],
                "final_val_loss": summary.get("val_loss"),
                "last_val_loss": evals[-1]["val_loss"] if evals else None,
                "data_sha256": summary.get("data_sha256"),
            }
        )
        curves += [{"run": name, **r} for r in records]
    pd.DataFrame(rows).to_csv(out / "half_batch.csv", index=False, float_format="%.10g")
    with gzip.open(out / "half_batch_curves.csv.gz", "wt") as f:
        pd.DataFrame(curves).to_csv(f, index=False, float_format="%.10g")
    print(pd.DataFrame(rows).to_string(index=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["configs", "collect"])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "law_miss")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "law_miss")
    args = parser.parse_args()
    if args.command == "configs":
        configs(args.out)
    else:
        collect(args.runs, args.out)


if __name__ == "__main__":
    main()
