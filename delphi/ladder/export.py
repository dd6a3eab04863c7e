"""A planned ladder as a recipe another trainer can follow (`delphi ladder export`, docs/export.md).

    export_rung(run_id, budget, cfg) -> dict      every number one rung trains with, flat
    export_ladder(ladder_dir) -> dict             {"ladder": ..., "conventions": ..., "rungs": [...]}
    write_export(doc, path)                       .csv (one row per rung) or .json, by the extension

Nothing here is a new rule: each number is what Delphi's own trainer applies to that rung, read from
the rung's train config (configs/<run_id>.yaml) through the functions the trainer uses --
`delphi.train.optim.group_hyperparams` (each parameter group's update rule, LR multiplier, decay and
eps), `delphi.train.schedules` (warmup and decay in steps) and `delphi.model.flops` (exact FLOPs per
token) -- plus the init and forward multipliers of `delphi.model.transformer` and `delphi.model.moe`
(tests/test_planner.py checks them against a model built from an exported rung).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError
from delphi.io import atomic_write_json, atomic_write_text
from delphi.ladder.collect import ladder_spec_of
from delphi.ladder.manifest import SPEC_FILE, read_manifest
from delphi.model.config import ModelConfig
from delphi.model.flops import count_params, flops_per_token
from delphi.train.config import TrainConfig, load_train_config
from delphi.train.optim import group_hyperparams
from delphi.train.schedules import decay_steps, warmup_steps

# The muP parameter groups (delphi.model.mup.GROUPS) under the names the export gives them.
EXPORT_GROUPS = {
    "embedding": "embedding",
    "hidden": "hidden",
    "unembedding": "unembedding",
    "router": "router",
    "vector": "norm",
}
EXPORT_FORMATS = (".csv", ".json")

# What a trainer needs to know once for every rung: the architecture and the conventions of the numbers.
CONVENTIONS = {
    "architecture": "decoder-only transformer, pre-norm RMSNorm (gain only), RoPE, QK-norm (RMSNorm over each head), "
    "causal attention, SwiGLU feed-forward (dense, or top-k routed experts of width d_expert), final "
    "RMSNorm, untied embedding and unembedding, no biases",
    "flops": "flops_per_token: exact training FLOPs per token, 3 x forward (Chinchilla, Hoffmann et al. 2022, app. F: "
    "attention, feed-forward, router and logits; the embedding lookup left out); flops = tokens x flops_per_token",
    "params": "params_nonembedding (N of the fits): active parameters without the embedding and unembedding "
    "matrices; params_active adds them; params_total counts every expert",
    "groups": "embedding: the token embedding; hidden: every matrix of attention, dense FFN and experts (routed and "
    "shared); unembedding: the output projection; router: the d_model x experts router; norm: every "
    "RMSNorm and QK-norm gain",
    "lr": "{group}_lr is the group's peak LR: the schedule multiplies it by factor(step) (see schedule); "
    "{group}_weight_decay is decoupled and multiplied by the LR at each step, as torch.optim.AdamW and "
    "optax.adamw apply it",
    "update": "adamw: AdamW; adam: Adam without weight decay; adamh: Adam's bias-corrected direction u, then "
    "W <- (W - lr ||W|| u / ||u||) rescaled to ||W0||, the matrix's initial Frobenius norm (per expert for "
    "stacked experts). Gradients are clipped to global norm grad_clip over all groups first",
    "schedule": "factor(step), step = 0 .. steps-1: warmup min(1, (step + 1) / warmup_steps); wsd: 1 until the last "
    "decay_steps, then 1 - (1 - min_lr_frac) p (linear) or min_lr_frac + (1 - min_lr_frac)(1 - sqrt(p)) "
    "(sqrt) with p = (step + 1 - (steps - decay_steps)) / decay_steps; cosine: after warmup "
    "min_lr_frac + (1 - min_lr_frac)(1 + cos(pi p)) / 2 with p = (step + 1 - warmup_steps) / (steps - "
    "warmup_steps); constant: 1 after warmup",
    "init": "normal with mean 0 and std init_std_{group}; 0 means zeros; norm gains start at 1, the router's "
    "balancing bias at 0",
    "forward": "embedding output x embedding_multiplier; logits x logit_multiplier; router logits x "
    "router_logit_multiplier; attention logits q.k x attention_scale; each residual branch (attention "
    "and FFN output) x residual_branch_multiplier before it is added",
    "moe": "router scores: softmax (or sigmoid) of the router logits x router_logit_multiplier; the top_k experts "
    "are chosen on scores + a bias that only selects (balance bias: after each step bias += "
    "router_bias_update_rate x sign(mean load - load); 0 otherwise); gates are the chosen scores, normalised "
    "over the top_k when top_k > 1, x route_scale; losses added per MoE layer: router_z_loss_weight x mean "
    "logsumexp(logits)^2 and (balance aux) router_aux_loss_weight x experts x sum_i f_i P_i; in training each "
    "expert takes capacity_factor x its even share of the assignments (beyond it they are dropped; "
    "capacity_factor >= experts / top_k is dropless), evaluation is dropless",
}


def _schedule_steps(cfg: TrainConfig) -> dict[str, int]:

    o, steps = cfg.optim, cfg.steps
    warmup = warmup_steps(o, steps)
    decay = decay_steps(o, steps) if o.schedule == "wsd" else (steps - warmup if o.schedule == "cosine" else 0)
    return {"warmup_steps": warmup, "stable_steps": steps - warmup - decay, "decay_steps": decay}


def init_stds(model: ModelConfig) -> dict[str, float]:
    """Init std of each group as delphi.model.transformer and delphi.model.moe draw it (0: zeros)."""
    mup = model.mup
    sigma = mup.init_std
    return {
        "embedding": sigma,  # constant std
        "hidden": sigma / math.sqrt(model.width_mult),  # sigma / sqrt(m)
        "unembedding": 0.0 if (mup.enabled and mup.zero_init_unembedding) else sigma,
        "router": sigma,  # never zero: equal scores would send every token to the same experts at step 0
    }


def forward_multipliers(model: ModelConfig) -> dict[str, float]:
    """The forward multipliers delphi.model.transformer and delphi.model.moe apply."""
    mup = model.mup
    return {
        "embedding_multiplier": mup.alpha_in if mup.enabled else 1.0,
        "logit_multiplier": mup.alpha_out / model.width_mult if mup.enabled else 1.0,
        "router_logit_multiplier": 1.0 / model.width_mult,
        "attention_scale": 1.0 / model.d_head if mup.enabled else 1.0 / math.sqrt(model.d_head),
        "residual_branch_multiplier": 1.0 / model.depth_mult,
    }


def export_rung(run_id: str, budget: float, cfg: TrainConfig) -> dict[str, Any]:
    """Every number rung `run_id` trains with, flat (one CSV row); see CONVENTIONS for their meaning."""

    m, o, counts = cfg.model, cfg.optim, count_params(cfg.model)
    fpt = flops_per_token(m, cfg.data.seq_len)
    moe = m.moe
    row: dict[str, Any] = {
        "run_id": run_id,
        "budget_flops": budget,
        "flops": cfg.tokens * fpt,
        "flops_per_token": fpt,
        "flops_per_token_6n": 6.0 * counts.nonembedding,
        "tokens": cfg.tokens,
        "steps": cfg.steps,
        "batch_size": cfg.data.batch_size,
        "batch_tokens": cfg.tokens_per_step,
        "seq_len": cfg.data.seq_len,
        "params_nonembedding": counts.nonembedding,
        "params_active": counts.active,
        "params_total": counts.total,
        "tokens_per_param": cfg.tokens / counts.nonembedding,
        "vocab_size": m.vocab_size,
        "d_model": m.d_model,
        "n_layers": m.n_layers,
        "n_heads": m.n_heads,
        "d_head": m.d_head,
        "d_ff": m.d_ff if moe is None else 0,
        "experts": moe.experts if moe else 0,
        "top_k": moe.top_k if moe else 0,
        "d_expert": moe.d_expert if moe else 0,
        "granularity": m.d_ff / moe.d_expert if moe else 0,
        "shared_experts": moe.shared_experts if moe else 0,
        "router_score": moe.score if moe else "",
        "router_balance": moe.balance if moe else "",
        "router_bias_update_rate": moe.bias_update_rate if moe and moe.balance == "bias" else 0.0,
        "router_aux_loss_weight": moe.aux_loss_weight if moe and moe.balance == "aux" else 0.0,
        "router_z_loss_weight": moe.z_loss_weight if moe else 0.0,
        "capacity_factor": moe.capacity_factor if moe else 0.0,
        "route_scale": moe.route_scale if moe else 0.0,
        "rope_theta": m.rope_theta,
        "norm_eps": m.norm_eps,
        "optimizer": o.optimizer,
        "lr": o.lr,
        "adam_lr": o.adam_lr if o.adam_lr is not None else "",
        "beta1": o.beta1,
        "beta2": o.beta2,
        "eps": o.eps,
        "weight_decay": o.weight_decay if o.optimizer == "adamw" else 0.0,
        "grad_clip": o.grad_clip,
        "schedule": o.schedule,
        **_schedule_steps(cfg),
        "decay_shape": o.decay_shape if o.schedule == "wsd" else "",
        "min_lr_frac": o.min_lr_frac,
    }
    for group, hp in group_hyperparams(m, o).items():
        name = EXPORT_GROUPS[group]
        base = o.lr if hp["base_lr"] == "lr" else o.adam_lr
        row[f"{name}_update"] = hp["rule"]
        row[f"{name}_lr_multiplier"] = hp["lr_multiplier"]
        row[f"{name}_lr"] = float(base) * float(hp["lr_multiplier"])
        row[f"{name}_weight_decay"] = hp["weight_decay"]
    row["adam_eps"] = float(group_hyperparams(m, o)["hidden"]["eps"])  # every group's: eps / (m m_L) (CompleteP)
    stds = init_stds(m)
    for group in ("embedding", "hidden", "unembedding", "router"):
        row[f"init_std_{group}"] = stds[group] if group != "router" or moe else 0.0
    row.update(forward_multipliers(m))
    if moe is None:
        row["router_logit_multiplier"] = 0.0
    row.update(
        {
            "mup_width_multiplier": m.width_mult,
            "mup_depth_multiplier": m.depth_mult,
            "precision": cfg.precision,
            "seed": cfg.seed,
            "data_seed": cfg.data.seed,
            "eval_every_steps": cfg.eval_every,
            "eval_tokens": cfg.eval_tokens,
            "final_eval_tokens": cfg.final_eval_tokens if cfg.final_eval_tokens is not None else cfg.eval_tokens,
            "data_store": cfg.data.store,
        }
    )
    return row


def export_ladder(ladder_dir: str | Path) -> dict[str, Any]:
    """{"ladder": name, budgets, spec path; "conventions": CONVENTIONS; "rungs": export_rung per manifest row}."""

    ladder_dir = Path(ladder_dir)
    rows = read_manifest(ladder_dir)
    rungs = []
    for row in rows:
        config = ladder_dir / row["config"]
        if not config.is_file():
            raise DelphiError(
                f"{ladder_dir}/manifest.csv: rung {row['run_id']}: config {config} is missing; "
                f"re-plan with `delphi ladder plan SPEC --out {ladder_dir}`"
            )
        rungs.append(export_rung(row["run_id"], float(row.get("budget") or 0.0), load_train_config(config)))
    spec = ladder_spec_of(ladder_dir)
    ladder = {
        "dir": str(ladder_dir),
        "rungs": len(rungs),
        "budgets": sorted({r["budget_flops"] for r in rungs}),
        "flops_total": sum(r["flops"] for r in rungs),
    }
    if spec is not None:
        ladder.update(name=spec.name, spec=str(ladder_dir / SPEC_FILE))
    return {"ladder": ladder, "conventions": CONVENTIONS, "rungs": rungs}


def export_format(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in EXPORT_FORMATS:
        raise DelphiError(
            f"--out: {path}: expected a file ending in {' or '.join(EXPORT_FORMATS)} (the format), got {suffix or 'no extension'}"
        )
    return suffix


def write_export(doc: dict[str, Any], path: str | Path, written_by: str) -> None:
    """The export as CSV (one row per rung, columns as export_rung orders them) or JSON, atomically."""

    if export_format(path) == ".json":
        atomic_write_json(path, doc, written_by=written_by)
        return
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(doc["rungs"][0]), lineterminator="\n")
    writer.writeheader()
    for row in doc["rungs"]:
        writer.writerow({k: repr(v) if isinstance(v, float) else v for k, v in row.items()})
    atomic_write_text(path, buf.getvalue(), written_by=written_by)  # its marker in FILE.delphi.json
