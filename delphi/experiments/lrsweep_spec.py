"""What `delphi mup lr-sweep` trains: the widths, base LRs and shapes of a muP learning-rate sweep."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from delphi.errors import DelphiError, quoted
from delphi.experiments.shapes import WidthFamily
from delphi.model.config import ModelConfig, MoEConfig
from delphi.train.config import DataConfig, OptimConfig, TrainConfig

# Defaults sized for a few minutes on 2 CPU cores. Many small steps rather than a few big ones: a
# run too short sits on the early loss plateau, whose exit time is erratic, and its final loss is
# not monotone in LR. The grid is centred on the optimum of the smallest widths, 2x apart
# (docs/notebook.md §8.28 has the pilot runs behind these numbers).
DEFAULT_WIDTHS = (32, 64, 128)
DEFAULT_LRS = (1.5e-3, 3e-3, 6e-3, 1.2e-2, 2.4e-2)
DEFAULT_STEPS = 1000
DEFAULT_BATCH_SIZE = 8


@dataclass(frozen=True)
class LRSweepSpec:
    widths: tuple[int, ...] = DEFAULT_WIDTHS  # the first is the muP base width
    lrs: tuple[float, ...] = DEFAULT_LRS  # base Adam LRs (at the base width)
    steps: int = DEFAULT_STEPS
    ffn: str = "dense"  # "dense" or "moe"
    n_layers: int = 2
    d_head: int = 16  # fixed head size: heads grow with width (muP practice)
    ffn_mult: int = 4  # d_ff = 4 d; MoE: 4 experts top-2 of width d (granularity 4)
    experts: int = 4
    top_k: int = 2
    batch_size: int = DEFAULT_BATCH_SIZE
    seq_len: int = 64
    eval_tokens: int = 16_384
    store: str = "stdlib"
    seed: int = 0

    def validate(self) -> "LRSweepSpec":
        if len(self.widths) < 2 or list(self.widths) != sorted(set(self.widths)) or self.widths[0] <= 0:
            raise DelphiError(f"--widths: need at least two increasing positive widths, got {list(self.widths)}")
        bad = [w for w in self.widths if w % self.d_head]
        if bad:
            raise DelphiError(f"--widths: every width must be a multiple of the head size {self.d_head}, got {bad}")
        if (
            len(self.lrs) < 3
            or any(not (lr > 0 and math.isfinite(lr)) for lr in self.lrs)
            or len(set(self.lrs)) != len(self.lrs)
        ):
            raise DelphiError(f"--lrs: need at least three distinct positive learning rates, got {list(self.lrs)}")
        if len({run_id(self.widths[0], lr) for lr in self.lrs}) != len(self.lrs):
            raise DelphiError(
                f"--lrs: learning rates must differ in their first 3 significant digits (run ids), got {list(self.lrs)}"
            )
        for flag, value in (
            ("steps", self.steps),
            ("layers", self.n_layers),
            ("batch-size", self.batch_size),
            ("seq-len", self.seq_len),
            ("eval-tokens", self.eval_tokens),
        ):
            if value <= 0:
                raise DelphiError(f"--{flag}: must be a positive integer, got {value}")
        if self.ffn not in ("dense", "moe"):
            raise DelphiError(f"--ffn: expected dense or moe, got {quoted(self.ffn)}")
        for w in self.widths:
            self.model_config(w)
        return self

    @property
    def family(self) -> WidthFamily:
        moe = MoEConfig(experts=self.experts, top_k=self.top_k, balance="bias") if self.ffn == "moe" else None
        return WidthFamily(self.widths[0], self.n_layers, self.d_head, self.ffn_mult, moe=moe, mup=True)

    def model_config(self, width: int) -> ModelConfig:
        return self.family.config(width, "lr_sweep")

    def train_config(self, width: int, lr: float) -> Any:
        # Log ten times per run when the steps allow it; one eval and no checkpoint before the end.
        log_every = self.steps // 10 if self.steps % 10 == 0 else self.steps
        return TrainConfig(
            model=self.model_config(width),
            data=DataConfig(store=self.store, seq_len=self.seq_len, batch_size=self.batch_size, seed=self.seed),
            optim=OptimConfig(lr=lr),
            steps=self.steps,
            seed=self.seed,
            log_every=log_every,
            eval_every=self.steps,
            eval_tokens=self.eval_tokens,
            checkpoint_every=self.steps,
            keep_checkpoints=1,
            name=run_id(width, lr),
        ).validate()


def run_id(width: int, lr: float) -> str:
    return f"w{width}-lr{lr:.3g}"
