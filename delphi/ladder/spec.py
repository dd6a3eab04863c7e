"""Ladder spec: the YAML file that defines a ladder (docs/design.md §5).

A spec names the compute budgets, the sequence length and vocabulary, the base
(proxy) model with its tuned hyperparameters, the shape family, the transfer
recipe and how rungs are chosen per budget. No constant of the recipe lives in
code: the dataclass defaults below are only fallbacks, and the shipped specs in
studies/ set every one of them explicitly with its source in a comment.

`load_ladder_spec(path)` rejects unknown keys and impossible values with the
dotted name of the field (e.g. `budgets[2]: ...`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from delphi.config_schema import from_dict, load_config, to_dict
from delphi.errors import DelphiError
from delphi.ladder.recipe import RecipeSpec, check_owned_keys, drop_owned_keys
from delphi.model.config import (
    DEEPSEEK_V3_BIAS_UPDATE_RATE,
    ST_MOE_Z_LOSS_WEIGHT,
    SWITCH_AUX_LOSS_WEIGHT,
    SWITCH_CAPACITY_FACTOR,
    routing_problems,
)

# Rung health bounds (issue 10, "Healthy rungs, checked"): the defaults of the `health:` section.
# The first paper's short MoE rungs dropped 10-33% of routed tokens and its fits credited the lost
# expert compute to N and D (drop share vs log steps: r = -0.84); 2% is what its hero reached.
HEALTH_MAX_DROP_FRAC = 0.02
# At d_model 8 with 2 layers the embeddings were 73% of the active parameters: no longer a transformer
# whose N behaves like a large model's. >= 3 layers and d_model >= 24 (issue 10).
HEALTH_MIN_LAYERS = 3
HEALTH_MIN_D_MODEL = 24
# >= 10 evals per run (a curve, not two points) on >= 1M validation tokens (issue 10; the first paper's
# 65K tokens left a sampling error comparable to the differences the fits resolve).
HEALTH_MIN_EVALS = 10
HEALTH_MIN_EVAL_TOKENS = 1_000_000
# Repeating data up to ~4 epochs costs almost nothing against fresh data; beyond, returns fall
# quickly (Muennighoff et al. 2023, "Scaling Data-Constrained Language Models", sec. 5).
DATA_CONSTRAINED_MAX_EPOCHS = 4.0
# No published LM pretraining schedule runs much past 1e6 steps (T5: 2^19; PaLM: 255k): a plan
# beyond this is a units mistake (e.g. `budgets: [1.0e+30]`), not a ladder rung.
SANE_MAX_STEPS = 1_000_000


@dataclass(frozen=True)
class BaseSpec:
    """The proxy model: muP base shape and the hyperparameters tuned on it."""

    d_model: int = 64
    n_layers: int = 2
    lr: float = 1e-2  # Adam LR tuned at the base shape, batch and token horizon
    batch_tokens: int = 4096  # tokens per step at which lr was tuned (B0)
    tokens: float = 1.6e7  # token horizon at which lr was tuned (T0)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    init_std: float = 0.02
    alpha_in: float = 1.0
    alpha_out: float = 1.0


@dataclass(frozen=True)
class DepthSpec:
    # ratio: layers = round(d / ratio); marin: layers = round(d / (64 + 4 log2 d - 9)); both clipped
    rule: Literal["ratio", "marin"] = "ratio"
    ratio: float = 32.0
    min_layers: int = 2
    max_layers: int = 8


@dataclass(frozen=True)
class MoEShapeSpec:
    experts: int = 8
    top_k: int = 2
    granularity: float = 4.0  # G = d_ff / d_expert (Krajewski et al. 2024), d_ff = ffn_mult * d
    shared_experts: int = 0
    score: Literal["softmax", "sigmoid"] = "softmax"
    balance: Literal["bias", "aux", "none"] = "bias"
    bias_update_rate: float = DEEPSEEK_V3_BIAS_UPDATE_RATE
    aux_loss_weight: float = SWITCH_AUX_LOSS_WEIGHT
    z_loss_weight: float = ST_MOE_Z_LOSS_WEIGHT
    capacity_factor: float = SWITCH_CAPACITY_FACTOR


@dataclass(frozen=True)
class ShapeSpec:
    widths: tuple[int, ...] = (16, 24, 32, 48, 64, 96, 128)  # d_model grid a rung is chosen from
    depth: DepthSpec = field(default_factory=DepthSpec)
    head_dim: int = 16  # heads = d / head_dim (one head of size d when d < head_dim); unused with n_heads
    # A fixed head count for every width (head size d / n_heads) instead of head_dim: below
    # d ~ 3 head_dim the count d / head_dim jumps 1 -> 2 -> 4 inside an isoFLOP curve, and
    # a jump moves the loss by more than the seed noise (ladder_default.yaml's header).
    n_heads: int | None = None
    ffn_mult: float = 4.0  # dense SwiGLU hidden width = ffn_mult * d
    ffn_multiple: int = 8  # round hidden widths up to a multiple of this
    moe: MoEShapeSpec | None = None
    hero_width_multiple: int = 64  # the hero's width is searched over multiples of this


@dataclass(frozen=True)
class IsoflopSpec:
    sizes: int = 5  # rungs per budget
    span: float = 10.0  # targeted max N / min N per budget, log-spaced around the centre
    min_span: float = 8.0  # the achieved spread must reach this
    # Expected optimum N*(C) = center_coefficient * C ** center_exponent (N: active non-embedding)
    center_coefficient: float = 1.0
    center_exponent: float = 0.5
    # (budget, N*) pairs for budgets where that formula misses, e.g. below the width grid, where it
    # cannot place a curve at all; the formula still holds at every other budget, so adding a
    # budget this way leaves every existing rung as it was.
    center_at: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class TokensPerParamSpec:
    ratio: float = 20.0  # tokens per active non-embedding parameter
    max_ratio_error: float = 0.5  # |achieved / ratio - 1| allowed (widths are discrete)


@dataclass(frozen=True)
class BatchSpec:
    # batch (sequences) = largest power of two <= tokens / (min_steps * seq_len), clipped.
    # rule "budget": one batch per budget, from its rung with the fewest tokens, so batch size
    # is not a confound along an isoFLOP curve; rule "rung": each rung from its own tokens.
    rule: Literal["budget", "rung"] = "budget"
    min_steps: int = 300
    max_steps: int = SANE_MAX_STEPS  # a rung (or hero) past this many steps is a planning error
    min_seqs: int = 4
    max_seqs: int = 64


@dataclass(frozen=True)
class Beta2Spec:
    # constant: beta2 = base.beta2
    # batch_power: beta2 = clip(anchor ** (batch_tokens / ref_batch_tokens), min, max), i.e. the
    # second moment's half-life fixed in tokens; the anchor defaults to the proxy's (base.beta2 at
    # base.batch_tokens). Marin's rule is anchor 0.999 at 131072 tokens, clipped to [0.95, 0.9999].
    rule: Literal["constant", "batch_power"] = "constant"
    anchor: float | None = None
    ref_batch_tokens: int | None = None
    min: float = 0.9
    max: float = 0.999


@dataclass(frozen=True)
class TransferSpec:
    mup: bool = True  # muP width transfer relative to base.d_model
    depth_transfer: bool = True  # CompleteP relative to base.n_layers
    # lr = base.lr * (B/B0)^batch_exponent * (T0/T)^horizon_exponent * (d/d0)^-width_exponent, capped
    batch_exponent: float = 0.5
    horizon_exponent: float = 0.0
    width_exponent: float = 0.0
    lr_max: float = 0.1
    beta2: Beta2Spec = field(default_factory=Beta2Spec)
    schedule: Literal["wsd", "cosine", "constant"] = "wsd"
    warmup_frac: float = 0.1
    decay_frac: float = 0.2
    decay_shape: Literal["linear", "sqrt"] = "linear"
    min_lr_frac: float = 0.0


@dataclass(frozen=True)
class RunSpec:
    store: str = "stdlib"
    precision: Literal["f32", "bf16"] = "f32"
    seeds: tuple[int, ...] = (0,)  # one run per (rung, seed)
    top_seeds: tuple[int, ...] = ()  # seeds of the top budget's rungs instead of `seeds` (empty: `seeds`)
    max_epochs: float = DATA_CONSTRAINED_MAX_EPOCHS  # passes over the store's train split allowed per run
    eval_tokens: int = 65_536
    final_eval_tokens: int | None = None  # the last evaluation's (the fitted loss); None: eval_tokens
    evals_per_run: int = 4
    logs_per_run: int = 50
    checkpoints_per_run: int = 4
    keep_checkpoints: int = 1


@dataclass(frozen=True)
class AnchorSpec:
    """Long rungs of small shapes outside the isoFLOP sets (issue 10, "Pinning E"): each width in
    `widths` trained on `multiple` x the top budget, at the top budget's batch and seeds.

    Why: a 30x hero sized by the law trains ~6x the tokens of the top budget's optimum, and more
    steps than any isoFLOP rung (paper v2: 129K against 37K), so gate hero_ranges refuses it; and
    the law's data term is identified only by runs far past their optimum. These rungs are both.
    They join the (N, D) fits and the ladder's steps and tokens-per-parameter ranges; the laws in C
    (isoFLOP, frontier) and every per-budget check leave them out (results column `role`)."""

    widths: tuple[int, ...] = ()
    multiple: float = 4.0
    seeds: int | None = None  # each anchor trains the first `seeds` of the top budget's seeds (None: all)


@dataclass(frozen=True)
class HealthSpec:
    """Bounds every rung must meet (flagged in the results table, the report and the gates)."""

    max_drop_frac: float = HEALTH_MAX_DROP_FRAC  # mean share of routed assignments dropped in training
    min_layers: int = HEALTH_MIN_LAYERS
    min_d_model: int = HEALTH_MIN_D_MODEL
    min_evals: int = HEALTH_MIN_EVALS  # evaluations logged per run (incl. the final one)
    min_eval_tokens: int = HEALTH_MIN_EVAL_TOKENS  # validation tokens of the final evaluation (the fitted loss)


@dataclass(frozen=True)
class LadderSpec:
    name: str = "ladder"
    mode: Literal["isoflop", "tokens_per_param"] = "isoflop"
    budgets: tuple[float, ...] = ()
    seq_len: int = 128
    vocab_size: int = 256
    tolerance: float = 0.01  # every rung's exact FLOPs within this fraction of its budget
    base: BaseSpec = field(default_factory=BaseSpec)
    shape: ShapeSpec = field(default_factory=ShapeSpec)
    batch: BatchSpec = field(default_factory=BatchSpec)
    transfer: TransferSpec = field(default_factory=TransferSpec)
    isoflop: IsoflopSpec | None = None
    tokens_per_param: TokensPerParamSpec | None = None
    run: RunSpec = field(default_factory=RunSpec)
    health: HealthSpec = field(default_factory=HealthSpec)
    anchors: AnchorSpec | None = None
    # Batch, optimizer, LR per group, eps, beta2 and schedule of every run (delphi.ladder.recipe);
    # None: the batch rule of `batch:` and the transfer rule of `transfer:` and `base:` (old specs).
    recipe: RecipeSpec | None = None

    def seeds_for(self, budget: float) -> tuple[int, ...]:
        """The seeds of the rungs at `budget`: run.top_seeds at the top budget when given."""
        if self.run.top_seeds and budget == max(self.budgets):
            return self.run.top_seeds
        return self.run.seeds

    def validate(self) -> "LadderSpec":
        def need(ok: bool, key: str, message: str) -> None:
            if not ok:
                raise DelphiError(f"{key}: {message}")

        need(len(self.budgets) > 0, "budgets", "at least one compute budget is required")
        for i, b in enumerate(self.budgets):
            need(b > 0, f"budgets[{i}]", f"must be a positive number of FLOPs, got {b:g}")
            if i:
                prev = self.budgets[i - 1]
                need(b > prev, f"budgets[{i}]", f"budgets must increase, got {b:g} after {prev:g}")
        need(self.seq_len > 0, "seq_len", f"must be positive, got {self.seq_len}")
        need(self.vocab_size > 0, "vocab_size", f"must be positive, got {self.vocab_size}")
        need(0 < self.tolerance <= 0.1, "tolerance", f"must be in (0, 0.1], got {self.tolerance}")
        b = self.base
        for key in ("d_model", "n_layers", "batch_tokens"):
            need(getattr(b, key) > 0, f"base.{key}", f"must be positive, got {getattr(b, key)}")
        for key in ("lr", "tokens", "eps", "init_std"):
            need(getattr(b, key) > 0, f"base.{key}", f"must be positive, got {getattr(b, key)}")
        need(b.weight_decay >= 0, "base.weight_decay", f"must be >= 0, got {b.weight_decay}")
        need(0 <= b.beta1 < 1, "base.beta1", f"must be in [0, 1), got {b.beta1}")
        need(0 <= b.beta2 < 1, "base.beta2", f"must be in [0, 1), got {b.beta2}")
        s = self.shape
        need(len(s.widths) > 0, "shape.widths", "at least one width is required")
        for i, w in enumerate(s.widths):
            need(w >= 2 and w % 2 == 0, f"shape.widths[{i}]", f"must be an even width >= 2, got {w}")
        need(len(set(s.widths)) == len(s.widths), "shape.widths", "widths must be distinct")
        need(s.head_dim >= 2 and s.head_dim % 2 == 0, "shape.head_dim", f"must be even (RoPE), got {s.head_dim}")
        if s.n_heads is not None:
            need(s.n_heads >= 1, "shape.n_heads", f"must be >= 1, got {s.n_heads}")
            for i, w in enumerate(s.widths):
                need(w % (2 * s.n_heads) == 0, f"shape.widths[{i}]",
                     f"{w} does not split into {s.n_heads} heads of even size (RoPE); use a multiple of {2 * s.n_heads}")
            need(s.hero_width_multiple % (2 * s.n_heads) == 0, "shape.hero_width_multiple",
                 f"{s.hero_width_multiple} does not split into {s.n_heads} heads of even size; use a multiple of {2 * s.n_heads}")
        need(s.ffn_mult > 0, "shape.ffn_mult", f"must be positive, got {s.ffn_mult}")
        need(s.ffn_multiple >= 1, "shape.ffn_multiple", f"must be >= 1, got {s.ffn_multiple}")
        need(s.hero_width_multiple >= 2 and s.hero_width_multiple % 2 == 0, "shape.hero_width_multiple",
             f"must be an even width, got {s.hero_width_multiple}")
        d = s.depth
        need(d.ratio > 0, "shape.depth.ratio", f"must be positive, got {d.ratio}")
        need(1 <= d.min_layers <= d.max_layers, "shape.depth.min_layers",
             f"need 1 <= min_layers <= max_layers, got {d.min_layers}, {d.max_layers}")
        if s.moe is not None:
            m = s.moe
            for key, problem in routing_problems(m.experts, m.top_k, m.shared_experts):
                need(False, f"shape.moe.{key}", problem)
            need(m.granularity > 0, "shape.moe.granularity", f"must be positive, got {m.granularity}")
        bt = self.batch
        need(bt.min_steps >= 1, "batch.min_steps", f"must be >= 1, got {bt.min_steps}")
        need(bt.max_steps >= bt.min_steps, "batch.max_steps",
             f"must be >= batch.min_steps={bt.min_steps}, got {bt.max_steps}")
        need(1 <= bt.min_seqs <= bt.max_seqs, "batch.min_seqs",
             f"need 1 <= min_seqs <= max_seqs, got {bt.min_seqs}, {bt.max_seqs}")
        t = self.transfer
        need(t.lr_max > 0, "transfer.lr_max", f"must be positive, got {t.lr_max}")
        need(0 <= t.warmup_frac < 1, "transfer.warmup_frac", f"must be in [0, 1), got {t.warmup_frac}")
        need(0 <= t.decay_frac <= 1 - t.warmup_frac, "transfer.decay_frac",
             f"must be in [0, 1 - warmup_frac], got {t.decay_frac}")
        need(0 <= t.min_lr_frac <= 1, "transfer.min_lr_frac", f"must be in [0, 1], got {t.min_lr_frac}")
        b2 = t.beta2
        need(b2.anchor is None or 0 < b2.anchor < 1, "transfer.beta2.anchor", f"must be in (0, 1), got {b2.anchor}")
        need(b2.ref_batch_tokens is None or b2.ref_batch_tokens > 0, "transfer.beta2.ref_batch_tokens",
             f"must be positive, got {b2.ref_batch_tokens}")
        need(0 < b2.min <= b2.max < 1, "transfer.beta2.min", f"need 0 < min <= max < 1, got {b2.min}, {b2.max}")
        if self.mode == "isoflop":
            need(self.isoflop is not None, "isoflop", "mode isoflop needs an isoflop section")
            i = self.isoflop
            assert i is not None
            need(i.sizes >= 3, "isoflop.sizes", f"an isoFLOP curve needs >= 3 sizes, got {i.sizes}")
            need(i.span > 1, "isoflop.span", f"must be > 1, got {i.span}")
            need(1 <= i.min_span <= i.span, "isoflop.min_span", f"must be in [1, span={i.span}], got {i.min_span}")
            need(i.center_coefficient > 0, "isoflop.center_coefficient", f"must be positive, got {i.center_coefficient}")
            need(0 < i.center_exponent < 1, "isoflop.center_exponent", f"must be in (0, 1), got {i.center_exponent}")
            for k, pair in enumerate(i.center_at):
                key = f"isoflop.center_at[{k}]"
                need(len(pair) == 2 and pair[1] > 0, key, f"expected [budget, N* > 0], got {list(pair)}")
                need(any(math.isclose(pair[0], b, rel_tol=1e-9) for b in self.budgets), key,
                     f"budget {pair[0]:g} is not one of budgets {list(self.budgets)}")
        else:
            need(self.tokens_per_param is not None, "tokens_per_param", "mode tokens_per_param needs a tokens_per_param section")
            tp = self.tokens_per_param
            assert tp is not None
            need(tp.ratio > 0, "tokens_per_param.ratio", f"must be positive, got {tp.ratio}")
            need(tp.max_ratio_error > 0, "tokens_per_param.max_ratio_error", f"must be positive, got {tp.max_ratio_error}")
        r = self.run
        need(len(r.seeds) > 0, "run.seeds", f"at least one seed is required, got {list(r.seeds)}")
        for key, seeds in (("run.seeds", r.seeds), ("run.top_seeds", r.top_seeds)):
            for i, seed in enumerate(seeds):
                need(seed >= 0, f"{key}[{i}]", f"must be >= 0, got {seed}")
            repeated = sorted({s for s in seeds if seeds.count(s) > 1})
            need(not repeated, key, f"seeds must be distinct, got {list(seeds)} (repeated: {repeated})")
        need(r.max_epochs > 0, "run.max_epochs", f"must be positive, got {r.max_epochs}")
        for key in ("eval_tokens", "evals_per_run", "logs_per_run", "checkpoints_per_run", "keep_checkpoints"):
            need(getattr(r, key) > 0, f"run.{key}", f"must be positive, got {getattr(r, key)}")
        if r.final_eval_tokens is not None:
            need(r.final_eval_tokens >= r.eval_tokens, "run.final_eval_tokens",
                 f"must be >= run.eval_tokens ({r.eval_tokens}), got {r.final_eval_tokens}")
        if self.anchors is not None:
            a = self.anchors
            need(len(a.widths) > 0, "anchors.widths", "at least one width is required (or leave anchors out)")
            for i, w in enumerate(a.widths):
                need(w >= 2 and w % 2 == 0, f"anchors.widths[{i}]", f"must be an even width, got {w}")
                if s.n_heads is not None:
                    need(w % (2 * s.n_heads) == 0, f"anchors.widths[{i}]",
                         f"{w} does not split into {s.n_heads} heads of even size (RoPE); use a multiple of {2 * s.n_heads}")
            need(len(set(a.widths)) == len(a.widths), "anchors.widths", f"widths must be distinct, got {list(a.widths)}")
            need(a.multiple > 1, "anchors.multiple", f"must be > 1 (x the top budget), got {a.multiple}")
            need(a.seeds is None or a.seeds >= 1, "anchors.seeds", f"must be >= 1 (or null: the top budget's seeds), got {a.seeds}")
        if self.recipe is not None:
            self.recipe.validate("recipe")
        h = self.health
        need(0 <= h.max_drop_frac <= 1, "health.max_drop_frac", f"must be in [0, 1], got {h.max_drop_frac}")
        for key in ("min_layers", "min_d_model", "min_evals", "min_eval_tokens"):
            need(getattr(h, key) >= 0, f"health.{key}", f"must be >= 0, got {getattr(h, key)}")
        return self


def ladder_spec_from_dict(data: dict) -> LadderSpec:
    check_owned_keys(data)
    return from_dict(LadderSpec, data).validate()


def load_ladder_spec(path: str | Path) -> LadderSpec:
    return load_config(path, ladder_spec_from_dict)


def ladder_spec_to_dict(spec: LadderSpec) -> dict:
    data = drop_owned_keys(to_dict(spec))
    iso = data.get("isoflop")
    if isinstance(iso, dict) and not iso.get("center_at"):  # a ladder.yaml written before it stays byte-identical
        data["isoflop"] = {k: v for k, v in iso.items() if k != "center_at"}
    return data
