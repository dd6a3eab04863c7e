"""The optimizer of a run: AdamW (default) or AdamH, with muP parameter groups.

Each parameter belongs to one muP group (`delphi.model.mup.param_group`:
embedding, hidden, unembedding, router, vector; `mup.param_labels` labels a tree).

`optimizer: adamw`: a group gets its own AdamW whose LR is the schedule times the group's LR
multiplier (hidden matrices: 1/m) and whose decoupled weight decay is the base decay times the
group's decay multiplier (hidden: m, vectors: 0). optax's adamw multiplies the decay by the LR,
so the per-step decay lr x decay is the same at every width, but it moves with the LR.

`optimizer: adamh` (delphi.train.adamh, where every tensor's group is listed): the hidden
matrices take AdamH steps of relative size eta = optim.lr x schedule, with no width term; every
other group takes plain Adam at optim.adam_lr x schedule x the group's muP LR multiplier (all 1).
No weight decay anywhere.

Adam's eps follows CompleteP under both: eps / (m * m_L). Global-norm clipping runs first, on
the raw gradient of all groups together.
"""

from __future__ import annotations

import dataclasses

import optax

from delphi.model import mup
from delphi.model.config import ModelConfig
from delphi.model.mup import GROUPS, param_labels
from delphi.train.adamh import ADAMH_GROUPS, adamh
from delphi.train.config import OptimConfig
from delphi.train.schedules import lr_schedule

__all__ = ["group_hyperparams", "make_optimizer", "param_labels"]


def group_hyperparams(model: ModelConfig, optim: OptimConfig) -> dict[str, dict[str, float | str]]:
    """Per group: its update rule, the base LR it scales ("lr": optim.lr; "adam_lr" for the Adam
    groups under adamh), its LR multiplier, decoupled decay and the shared Adam eps (for logging
    and tests). Under adamh the peak "lr" of an AdamH group is the relative step size eta."""
    eps = float(mup.adam_eps(model, optim.eps))
    out: dict[str, dict[str, float | str]] = {}
    for group in GROUPS:
        if optim.optimizer == "adamh":
            rule = "adamh" if group in ADAMH_GROUPS else "adam"
            base = "lr" if rule == "adamh" else "adam_lr"
            mult = 1.0 if rule == "adamh" else mup.lr_multiplier(model, group)  # AdamH: no width term
            decay = 0.0
        else:
            rule, base = "adamw", "lr"
            mult = mup.lr_multiplier(model, group)
            decay = optim.weight_decay * mup.weight_decay_multiplier(model, group)
        out[group] = {
            "rule": rule,
            "base_lr": base,
            "lr_multiplier": float(mult),
            "weight_decay": float(decay),
            "eps": eps,
        }
    return out


def group_transform(hp: dict[str, float | str], optim: OptimConfig, steps: int) -> optax.GradientTransformation:
    """One group's update: its rule at (base LR x schedule factor) x its multiplier."""
    base_lr = optim.lr if hp["base_lr"] == "lr" else optim.adam_lr
    schedule = lr_schedule(dataclasses.replace(optim, lr=base_lr), steps)
    mult = float(hp["lr_multiplier"])

    def lr(count):  # the AdamW expression of every run before AdamH, so their numbers are unchanged
        return schedule(count) * mult

    if hp["rule"] == "adamh":
        return adamh(lr, b1=optim.beta1, b2=optim.beta2, eps=float(hp["eps"]))
    if hp["rule"] == "adam":
        return optax.adam(learning_rate=lr, b1=optim.beta1, b2=optim.beta2, eps=float(hp["eps"]))
    return optax.adamw(
        learning_rate=lr, b1=optim.beta1, b2=optim.beta2, eps=float(hp["eps"]), weight_decay=float(hp["weight_decay"])
    )


def make_optimizer(model: ModelConfig, optim: OptimConfig, steps: int) -> optax.GradientTransformation:
    groups = group_hyperparams(model, optim)
    per_group = optax.multi_transform({g: group_transform(hp, optim, steps) for g, hp in groups.items()}, param_labels)
    if optim.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(optim.grad_clip), per_group)
    return per_group
