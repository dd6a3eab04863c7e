"""Model configuration: the transformer's shape, its MoE block and its muP multipliers.

All fields are plain data so a config round-trips through YAML unchanged. `validate`
is called before anything is compiled and names the offending field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from delphi.errors import DelphiError

# Load-balancing constants (docs/design.md §4.2), overridable per config.
DEEPSEEK_V3_BIAS_UPDATE_RATE = 1e-3  # gamma, DeepSeek-V3 (arXiv:2412.19437) sec. 2.1.2
SWITCH_AUX_LOSS_WEIGHT = 1e-2  # alpha, Switch Transformer (Fedus et al. 2021) sec. 2.2
ST_MOE_Z_LOSS_WEIGHT = 1e-3  # router z-loss, ST-MoE (Zoph et al. 2022) sec. 3.1
SWITCH_CAPACITY_FACTOR = 1.25  # Switch Transformer's default training capacity factor


def routing_problems(experts: int, top_k: int, shared_experts: int) -> list[tuple[str, str]]:
    """(key, what is wrong) for each invalid expert count: the one rule for a model config's `moe:`
    and a ladder spec's `shape.moe:`."""
    problems = []
    if experts < 1:
        problems.append(("experts", f"must be >= 1, got {experts}"))
    if not 1 <= top_k <= experts:
        problems.append(("top_k", f"must be in [1, experts={experts}], got {top_k}"))
    if shared_experts < 0:
        problems.append(("shared_experts", f"must be >= 0, got {shared_experts}"))
    return problems


@dataclass(frozen=True)
class MoEConfig:
    experts: int = 8  # routed experts E
    top_k: int = 2
    d_expert: int = 128  # hidden width of one SwiGLU expert; granularity G = d_ff / d_expert
    shared_experts: int = 0  # always-on experts of width d_expert
    score: Literal["softmax", "sigmoid"] = "softmax"
    balance: Literal["bias", "aux", "none"] = "bias"  # aux-loss-free bias, Switch aux loss, or neither
    bias_update_rate: float = DEEPSEEK_V3_BIAS_UPDATE_RATE
    aux_loss_weight: float = SWITCH_AUX_LOSS_WEIGHT  # used when balance == "aux"
    z_loss_weight: float = ST_MOE_Z_LOSS_WEIGHT
    capacity_factor: float = SWITCH_CAPACITY_FACTOR  # training; evaluation is dropless
    route_scale: float = 1.0  # multiplies the normalised top-k gates

    @property
    def d_active_ffn(self) -> int:
        """Hidden width of the FFN a token actually passes through."""
        return (self.top_k + self.shared_experts) * self.d_expert


@dataclass(frozen=True)
class MuPConfig:
    """muP (width) and CompleteP (depth) transfer relative to a base shape.

    See docs/design.md §4.4. `enabled: false` gives standard parameterisation
    (every matrix init std `init_std`, one LR), kept for the coordinate check
    that shows muP is doing something.
    """

    enabled: bool = True
    base_d_model: int = 64
    base_n_layers: int = 2
    init_std: float = 0.02  # sigma: embedding std, and hidden std at base width
    alpha_in: float = 1.0  # embedding output multiplier
    alpha_out: float = 1.0  # logits multiplied by alpha_out / m
    depth_transfer: bool = True  # CompleteP (alpha = 1): residual branches scaled by 1 / m_L
    zero_init_unembedding: bool = True


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256  # dense SwiGLU hidden width; unused when `moe` is set
    moe: MoEConfig | None = None
    mup: MuPConfig = field(default_factory=MuPConfig)
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def width_mult(self) -> float:
        """m = d_model / d_base (1 under standard parameterisation)."""
        return self.d_model / self.mup.base_d_model if self.mup.enabled else 1.0

    @property
    def depth_mult(self) -> float:
        """m_L = n_layers / n_layers_base (1 when depth transfer is off)."""
        if not (self.mup.enabled and self.mup.depth_transfer):
            return 1.0
        return self.n_layers / self.mup.base_n_layers

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def validate(self, where: str = "model") -> "ModelConfig":
        def need(ok: bool, key: str, message: str) -> None:
            if not ok:
                raise DelphiError(f"{where}.{key}: {message}")

        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff"):
            need(getattr(self, key) > 0, key, f"must be a positive integer, got {getattr(self, key)}")
        need(self.d_model % self.n_heads == 0, "n_heads", f"{self.n_heads} does not divide d_model={self.d_model}")
        need(self.d_head % 2 == 0, "n_heads", f"head size d_model/n_heads = {self.d_head} must be even for RoPE")
        need(self.rope_theta > 0, "rope_theta", f"must be positive, got {self.rope_theta}")
        need(self.norm_eps > 0, "norm_eps", f"must be positive, got {self.norm_eps}")
        mup = self.mup
        need(mup.base_d_model > 0, "mup.base_d_model", f"must be positive, got {mup.base_d_model}")
        need(mup.base_n_layers > 0, "mup.base_n_layers", f"must be positive, got {mup.base_n_layers}")
        need(mup.init_std > 0, "mup.init_std", f"must be positive, got {mup.init_std}")
        if self.moe is not None:
            moe = self.moe
            for key, problem in routing_problems(moe.experts, moe.top_k, moe.shared_experts):
                need(False, f"moe.{key}", problem)
            need(moe.d_expert > 0, "moe.d_expert", f"must be positive, got {moe.d_expert}")
            need(moe.capacity_factor > 0, "moe.capacity_factor", f"must be positive, got {moe.capacity_factor}")
            for key in ("bias_update_rate", "aux_loss_weight", "z_loss_weight"):
                need(getattr(moe, key) >= 0, f"moe.{key}", f"must be >= 0, got {getattr(moe, key)}")
        return self
