"""AdamW with muP parameter groups.

Each parameter belongs to one muP group (`delphi.model.mup.param_group`:
embedding, hidden, unembedding, router, vector; `mup.param_labels` labels a tree). A group gets its own AdamW
whose LR is the schedule times the group's LR multiplier (hidden matrices:
1/m) and whose decoupled weight decay is the base decay times the group's decay
multiplier (hidden: m, vectors: 0). optax's adamw multiplies the decay by the
LR, so LR x decay stays constant across widths: "independent" weight decay
(docs/design.md §4.4). Adam's eps follows CompleteP: eps / (m * m_L).

Global-norm clipping runs first, on the raw gradient of all groups together.
"""

from __future__ import annotations

import optax

from delphi.model import mup
from delphi.model.config import ModelConfig
from delphi.model.mup import GROUPS, param_labels
from delphi.train.config import OptimConfig
from delphi.train.schedules import lr_schedule

__all__ = ["group_hyperparams", "make_optimizer", "param_labels"]


def group_hyperparams(model: ModelConfig, optim: OptimConfig) -> dict[str, dict[str, float]]:
    """LR and decay multipliers per group, and the shared Adam eps (for logging and tests)."""
    eps = mup.adam_eps(model, optim.eps)
    return {
        group: {
            "lr_multiplier": float(mup.lr_multiplier(model, group)),
            "weight_decay": float(optim.weight_decay * mup.weight_decay_multiplier(model, group)),
            "eps": float(eps),
        }
        for group in GROUPS
    }


def make_optimizer(model: ModelConfig, optim: OptimConfig, steps: int) -> optax.GradientTransformation:
    schedule = lr_schedule(optim, steps)
    groups = group_hyperparams(model, optim)

    def group_adamw(hp: dict[str, float]) -> optax.GradientTransformation:
        mult = hp["lr_multiplier"]
        return optax.adamw(
            learning_rate=lambda count: schedule(count) * mult,
            b1=optim.beta1,
            b2=optim.beta2,
            eps=hp["eps"],
            weight_decay=hp["weight_decay"],
        )

    per_group = optax.multi_transform({g: group_adamw(hp) for g, hp in groups.items()}, param_labels)
    if optim.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(optim.grad_clip), per_group)
    return per_group
