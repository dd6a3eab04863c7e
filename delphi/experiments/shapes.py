"""The model family a muP experiment varies: the same model at several widths.

Heads grow with width at a fixed head size (muP practice), the FFN is `ffn_mult` x d_model wide,
and the first (smallest) width is the muP base, so a base LR means the same thing at every width.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from delphi.model.config import ModelConfig, MoEConfig, MuPConfig

# An expert is 1/EXPERT_GRANULARITY of the dense FFN (G = d_ff / d_expert): with ffn_mult 4 an
# expert is d_model wide, and top-2 of 4 experts is half the dense FFN's active width.
EXPERT_GRANULARITY = 4


@dataclass(frozen=True)
class WidthFamily:
    base_width: int  # the muP base d_model
    n_layers: int  # fixed: depth is also the CompleteP base
    d_head: int
    ffn_mult: int
    moe: MoEConfig | None = None  # experts, top_k, balance; d_expert follows the width
    mup: bool = True  # False: standard parameterisation (one LR, one init std)

    def config(self, width: int, where: str) -> ModelConfig:
        """The validated model at `width`; errors name `where` (the experiment)."""
        d_ff = self.ffn_mult * width
        moe = dataclasses.replace(self.moe, d_expert=d_ff // EXPERT_GRANULARITY) if self.moe is not None else None
        return ModelConfig(
            d_model=width,
            n_layers=self.n_layers,
            n_heads=width // self.d_head,
            d_ff=d_ff,
            moe=moe,
            mup=MuPConfig(enabled=self.mup, base_d_model=self.base_width, base_n_layers=self.n_layers),
        ).validate(where)
