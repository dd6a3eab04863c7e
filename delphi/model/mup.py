"""muP / CompleteP optimizer rules per parameter group (docs/design.md §4.4, Adam, multiplier form).

    group        Adam LR   weight decay   (m = d_model / base_d_model, m_L = n_layers / base_n_layers)
    embedding    eta       lambda
    hidden       eta / m   lambda * m     optax's adamw multiplies decay by the LR, so lambda*m keeps
                                          the decay timescale independent of width
    unembedding  eta       lambda
    router       eta       lambda         d_model -> E with E fixed: the unembedding rule
    vector       eta       0              norm gains
Adam eps: base_eps / (m * m_L) (CompleteP, Dey et al. 2025). Hidden LR is unchanged by depth.
Under standard parameterisation (mup.enabled false) m = m_L = 1, so every multiplier is 1,
except that vectors still get no weight decay.

The initialisation and forward multipliers live in delphi.model.transformer.
"""

from __future__ import annotations

from typing import Any, Literal

import jax

from delphi.model.config import ModelConfig

Group = Literal["embedding", "hidden", "unembedding", "router", "vector"]
GROUPS: tuple[Group, ...] = ("embedding", "hidden", "unembedding", "router", "vector")


def _name(key: Any) -> str | int:
    """A path entry as a plain str/int (accepts jax tree-path keys as well)."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return key


def param_group(path: tuple[str | int, ...]) -> Group:
    """The muP group of a parameter from its path in the model, e.g. ('blocks', 0, 'attn', 'w_qkv').

    A trailing 'value' (what jax tree paths of nnx Variables end with) is ignored.
    """
    names = [_name(p) for p in path]
    while names and names[-1] in ("value", "raw_value"):
        names.pop()
    leaf = names[-1] if names else None
    if leaf == "embedding":
        return "embedding"
    if leaf == "unembedding":
        return "unembedding"
    if leaf == "router":
        return "router"
    if leaf == "scale":  # RMSNorm and QK-norm gains
        return "vector"
    if isinstance(leaf, str) and leaf.startswith("w_"):  # attention, dense FFN, routed and shared experts
        return "hidden"
    raise ValueError(f"no muP group for parameter path {tuple(names)}")


def lr_multiplier(cfg: ModelConfig, group: Group) -> float:
    """Adam LR of `group` relative to the base LR eta."""
    _check(group)
    return 1.0 / cfg.width_mult if group == "hidden" else 1.0


def weight_decay_multiplier(cfg: ModelConfig, group: Group) -> float:
    """Decoupled weight decay of `group` relative to the base lambda (as passed to optax.adamw)."""
    _check(group)
    if group == "vector":
        return 0.0
    return cfg.width_mult if group == "hidden" else 1.0


def adam_eps(cfg: ModelConfig, base_eps: float) -> float:
    """Adam epsilon at this shape: base_eps / (m * m_L) (1 / m without depth transfer, unchanged under SP)."""
    return base_eps / (cfg.width_mult * cfg.depth_mult)


def param_labels(params: Any) -> Any:
    """The same pytree with every array replaced by its group name (for optax.multi_transform)."""
    return jax.tree_util.tree_map_with_path(lambda path, _: param_group(tuple(path)), params)


def _check(group: str) -> None:
    if group not in GROUPS:
        raise ValueError(f"unknown muP group {group!r}, expected one of {GROUPS}")
