"""Synthetic but real-shaped data for the prereg, curve and plot tests.

Run dirs are written exactly as the trainer writes them (config.yaml, status.json,
metrics.jsonl, summary.json), with eval losses drawn from a known LR-annealing law
plus Gaussian noise, so a fit can be checked against the parameters that made the data.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import yaml

from delphi.fits import curves as cv
from delphi.fits.evals import eval_steps
from delphi.model.config import ModelConfig
from delphi.model.flops import count_params, flops_per_token
from delphi.train.config import DataConfig, OptimConfig, TrainConfig, train_config_to_dict
from delphi.train.schedules import warmup_steps

# E, A, alpha, B, beta, C of the law that generates every curve.
TRUE = (0.9, 25.0, 0.35, 60.0, 0.3, 1e-4)
NOISE = 0.003  # sd of one eval, nats
OPTIM = OptimConfig(lr=1e-2, schedule="wsd", warmup_frac=0.05, decay_frac=0.2)
SEQ = 64


def train_config(d_model: int, steps: int, batch: int, name: str, eval_every: int | None = None) -> TrainConfig:
    model = ModelConfig(d_model=d_model, n_layers=2, n_heads=4, d_ff=4 * d_model)
    return TrainConfig(
        model=model,
        data=DataConfig(seq_len=SEQ, batch_size=batch),
        optim=OPTIM,
        steps=steps,
        eval_every=eval_every or max(steps // 20, 1),
        log_every=max(steps // 20, 1),
        name=name,
    )


def true_curve(cfg: TrainConfig, rng: np.random.Generator, noise: float = NOISE):
    """(steps, tokens, loss) at every eval step of `cfg`, from the true law plus noise."""
    lr = cv.lr_factors(cfg.optim, cfg.steps)
    s1, s2 = cv.annealing_areas(lr, cfg.tokens_per_step, warmup_updates=warmup_steps(cfg.optim, cfg.steps))
    steps = np.asarray(eval_steps(cfg.steps, cfg.eval_every))
    n = count_params(cfg.model).nonembedding
    loss = cv.law(TRUE, n, s1[steps], s2[steps]) + rng.normal(0.0, noise, steps.size)
    return steps, steps * cfg.tokens_per_step, loss


def metrics_rows(cfg: TrainConfig, steps, tokens, loss) -> list[dict]:
    fpt = flops_per_token(cfg.model, cfg.data.seq_len)
    rows, now = [], time.time()
    for k, (s, t, l) in enumerate(zip(steps, tokens, loss)):
        rows.append(
            {
                "step": int(s),
                "tokens": int(t),
                "flops": float(fpt * t),
                "lr": OPTIM.lr,
                "train_loss": float(l) + 0.01,
                "grad_norm": 1.0,
                "tokens_per_s": 1e5,
                "mfu": 0.3,
                "wall_s": 0.01 * (k + 1),
                "time": now + 0.01 * (k + 1),
                "val_loss": float(l),
                "val_bpb": float(l) / np.log(2),
            }
        )
    return rows


def write_run(run_dir: Path, cfg: TrainConfig, rng: np.random.Generator, *, status: str = "completed") -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(train_config_to_dict(cfg), sort_keys=False))
    steps, tokens, loss = true_curve(cfg, rng)
    rows = metrics_rows(cfg, steps, tokens, loss)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = count_params(cfg.model)
    fpt = flops_per_token(cfg.model, cfg.data.seq_len)
    summary = {
        "status": status,
        "steps": cfg.steps,
        "tokens": cfg.tokens,
        "flops": fpt * cfg.tokens,
        "val_loss": float(loss[-1]),
        "val_bpb": float(loss[-1]) / np.log(2),
        "params_total": counts.total,
        "params_active": counts.active,
        "params_nonembedding": counts.nonembedding,
        "flops_per_token": fpt,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "status.json").write_text(json.dumps({"status": status, "reason": "", "step": cfg.steps, "updated": ""}))
    return {
        "run_id": run_dir.name,
        "params": counts.nonembedding,
        "tokens": cfg.tokens,
        "flops": fpt * cfg.tokens,
        "loss": float(loss[-1]),
        "budget": None,
    }


WIDTHS = (32, 48, 64, 96, 128)
TOKENS_PER_PARAM = (10, 20, 40)


def write_ladder(root: Path, seed: int = 0) -> Path:
    """A 5-width x 3-horizon ladder of completed runs, plus manifest.csv and results.csv."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    for d in WIDTHS:
        for k in TOKENS_PER_PARAM:
            n = count_params(train_config(d, 100, 8, "x").model).nonembedding
            batch = 8
            steps = max(int(k * n / (batch * SEQ)), 100)
            name = f"d{d}_k{k}"
            rows.append(write_run(root / "runs" / name, train_config(d, steps, batch, name), rng))
    table = pd.DataFrame(rows)
    table["budget"] = table["flops"]
    table.to_csv(root / "results.csv", index=False)
    table[["run_id"]].to_csv(root / "manifest.csv", index=False)
    return root


def hero_config(d_model: int = 256, tokens_per_param: int = 20) -> TrainConfig:
    n = count_params(train_config(d_model, 100, 16, "h").model).nonembedding
    steps = int(tokens_per_param * n / (16 * SEQ))
    return train_config(d_model, steps, 16, "hero")


def write_hero(path: Path, cfg: TrainConfig) -> Path:
    path.write_text(yaml.safe_dump(train_config_to_dict(cfg), sort_keys=False))
    return path


def write_fit(ladder: Path, out: Path) -> Path:
    """Fit the parametric law to the ladder's final losses with the project's own fitter."""
    from delphi.fits.data import load_results
    from delphi.fits.parametric import fit_vpnls

    table = load_results(ladder / "results.csv")
    fit = fit_vpnls(table, n_bootstrap=40, seed=0)
    out.write_text(json.dumps(fit.to_json()))
    return out
