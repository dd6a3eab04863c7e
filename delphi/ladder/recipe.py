"""The training recipe: one pure function from a run's shape and token horizon to everything it
trains with (docs/design.md §5, Marin's "adamh_scaling_v6").

A ladder spec with a `recipe:` section hands batch size, optimizer, LR per parameter group, eps,
beta2, warmup and schedule of EVERY run it plans to this module: isoFLOP rungs, anchors,
calibration and recipe-check points, rehearsals, probes and the hero all call `recipe_for_tokens`
through `delphi.ladder.plan.make_rung`, so no batch rule, optimizer or schedule can switch
between them. A spec without `recipe:` plans by its `batch:`, `transfer:` and the hyperparameters
of `base:`.

The forms (Marin, experiments/scaling_law_sweeps/completed_adamh.py; constants are ours):

    batch (tokens per step)  B = seq_len x next power of two of T / (seq_len x target_steps)
                             (batch_rounding pow2, Marin's), or its nearest whole number of
                             sequences (nearest: every run trains ~target_steps steps),
                             halved while a cap is hit (lr > lr_max, adam_lr > adam_lr_max,
                             beta2 below beta2_min before clipping), not below min_seqs
    projection LR (AdamH)    eta   = lr x (B/B0)^batch_exponent x (T0/T)^horizon_exponent
                                     x (d/d0)^width_exponent, <= lr_max
    Adam-group LR            adam  = adam_lr x sqrt(B T0 / (B0 T)), <= adam_lr_max
    eps                      eps   = eps x sqrt(B0 T / (B T0))
    beta2                    beta2 = clip(beta2^(B/B0), beta2_min, beta2_max)
    beta1, grad_clip, schedule, warmup_frac, decay_frac: constants

Marin's forms have no width term (AdamH steps each matrix by a fraction of its own norm, which is
close to width-stable); `width_exponent` (0 by default) adds one where our own recipe check measures
a drift of the optimum with width.
Every constant is a {value, source} pair; `unsourced_constants` lists those without a source
(`delphi ladder plan` warns about each).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from delphi.errors import DelphiError
from delphi.train.config import OptimConfig


@dataclass(frozen=True)
class RecipeConstant:
    """A number of the recipe and where it came from: a citation, or the measurement file (relative
    to the spec) it was fitted on. A constant without a source is allowed but warned about."""

    value: float
    source: str | None = None


def _c(value: float, source: str | None = None) -> RecipeConstant:
    return RecipeConstant(value, source)


@dataclass(frozen=True)
class RecipeCheckSpec:
    """Where `delphi ladder recipe-check` measures the loss the recipe leaves on the table
    (delphi.ladder.recipe_check_plan). It must reach the planned hero: its width (`widths`) and its
    token count (`horizons`), and start at the smallest rung."""

    # The computes of the runs planned beyond the ladder (FLOPs); the largest is the planned hero.
    hero_computes: tuple[float, ...] = ()
    widths: tuple[int, ...] = ()  # width sweep, at `width_tokens` tokens
    width_tokens: float = 0.0  # tokens of every point of the width sweep
    horizons: tuple[float, ...] = ()  # horizon sweep (tokens), at `horizon_width`
    horizon_width: int = 0  # d_model of every point of the horizon sweep
    lr_multipliers: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)  # of the recipe's projection LR
    seeds: tuple[int, ...] = (0, 1)  # at multiplier 1; other multipliers train the first seed
    # Batch sweep at the widest width point and the longest horizon point: batches of the recipe's
    # times these, every other hyperparameter from the recipe at that batch.
    batch_multipliers: tuple[float, ...] = (0.25, 0.5, 2.0, 4.0)


@dataclass(frozen=True)
class RecipeSpec:
    # adamh: AdamH on every hidden matrix, plain Adam on the rest (delphi.train.adamh); adamw: AdamW
    optimizer: Literal["adamh", "adamw"] = "adamh"
    # Fixed-step batch rule: steps every run aims at (steps land in (target/2, target] before halving).
    target_steps: RecipeConstant = _c(4096)
    # pow2: Marin's power-of-two batch, so steps land anywhere in (target/2, target]; nearest: the
    # nearest whole number of sequences, so every run above the min_seqs floor trains ~target_steps.
    # Where loss still moves with the step count at fixed tokens (the default study: 2x the steps
    # at the same tokens -0.3..-0.9%, half +0.8..+3.1%), pow2's sawtooth puts that spread between
    # neighbouring rungs of one isoFLOP curve.
    batch_rounding: Literal["pow2", "nearest"] = "pow2"
    min_seqs: int = 1  # the halving stops here
    max_seqs: int = 4096  # a larger rule batch is clipped (the run then trains more steps)
    ref_batch_tokens: RecipeConstant = _c(1024)  # B0, tokens per step
    ref_tokens: RecipeConstant = _c(4_194_304)  # T0, token horizon
    lr: RecipeConstant = _c(3.3e-3)  # eta0: AdamH projection relative step at (B0, T0); AdamW: its LR
    batch_exponent: RecipeConstant = _c(0.5)  # the projection LR's (B/B0) exponent
    horizon_exponent: RecipeConstant = _c(0.3)  # p
    width_exponent: RecipeConstant = _c(0.0)  # the projection LR's (d/d0) exponent; 0: Marin's forms
    ref_d_model: RecipeConstant = _c(64)  # d0
    lr_max: RecipeConstant = _c(0.01)  # the projection LR's cap (the batch is halved while it binds)
    adam_lr: RecipeConstant = _c(1.4e-3)  # LR of the plain-Adam groups (embeddings, gains) at (B0, T0)
    adam_lr_max: RecipeConstant = _c(0.01)  # the Adam-group LR's cap (the batch is halved while it binds)
    eps: RecipeConstant = _c(1e-8)  # at (B0, T0)
    beta1: RecipeConstant = _c(0.9)  # Adam beta1
    beta2: RecipeConstant = _c(0.99)  # at B0
    beta2_min: RecipeConstant = _c(0.9)  # beta2's floor (the batch is halved while the rule falls below it)
    beta2_max: RecipeConstant = _c(0.9999)  # beta2's ceiling
    grad_clip: RecipeConstant = _c(1.0)  # global gradient-norm clip (0: none)
    weight_decay: RecipeConstant = _c(0.0)  # must be 0 under adamh
    schedule: Literal["wsd", "cosine", "constant"] = "wsd"  # LR schedule (as transfer.schedule)
    warmup_frac: RecipeConstant = _c(0.1)  # share of the steps in linear warmup
    decay_frac: RecipeConstant = _c(0.2)  # wsd: share of the steps in the final decay
    decay_shape: Literal["linear", "sqrt"] = "linear"  # wsd decay: linear or 1-sqrt
    min_lr_frac: RecipeConstant = _c(0.0)  # the LR's floor at the end, as a share of the peak
    check: RecipeCheckSpec | None = None  # the sweep of `delphi ladder recipe-check` (null: none)

    def constants(self) -> dict[str, RecipeConstant]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), RecipeConstant)
        }

    def validate(self, where: str = "recipe") -> "RecipeSpec":
        def need(ok: bool, key: str, message: str) -> None:
            if not ok:
                raise DelphiError(f"{where}.{key}: {message}")

        v = {k: c.value for k, c in self.constants().items()}
        for key, value in v.items():
            need(
                isinstance(value, (int, float)) and math.isfinite(value),
                f"{key}.value",
                f"must be a finite number, got {value!r}",
            )
        need(
            v["target_steps"] >= 1 and float(v["target_steps"]).is_integer(),
            "target_steps.value",
            f"must be a whole number of steps >= 1, got {v['target_steps']}",
        )
        need(
            1 <= self.min_seqs <= self.max_seqs,
            "min_seqs",
            f"need 1 <= min_seqs <= max_seqs, got {self.min_seqs}, {self.max_seqs}",
        )
        for key in ("ref_batch_tokens", "ref_tokens", "ref_d_model", "lr", "lr_max", "adam_lr", "adam_lr_max", "eps"):
            need(v[key] > 0, f"{key}.value", f"must be positive, got {v[key]}")
        need(0 <= v["beta1"] < 1, "beta1.value", f"must be in [0, 1), got {v['beta1']}")
        need(0 < v["beta2"] < 1, "beta2.value", f"must be in (0, 1), got {v['beta2']}")
        need(
            0 < v["beta2_min"] <= v["beta2_max"] < 1,
            "beta2_min.value",
            f"need 0 < beta2_min <= beta2_max < 1, got {v['beta2_min']}, {v['beta2_max']}",
        )
        need(v["grad_clip"] >= 0, "grad_clip.value", f"must be >= 0, got {v['grad_clip']}")
        need(v["weight_decay"] >= 0, "weight_decay.value", f"must be >= 0, got {v['weight_decay']}")
        need(
            self.optimizer != "adamh" or v["weight_decay"] == 0,
            "weight_decay.value",
            f"must be 0 under optimizer adamh (AdamH keeps every matrix at its initial norm), got {v['weight_decay']}",
        )
        need(0 <= v["warmup_frac"] < 1, "warmup_frac.value", f"must be in [0, 1), got {v['warmup_frac']}")
        need(
            0 <= v["decay_frac"] <= 1 - v["warmup_frac"],
            "decay_frac.value",
            f"must be in [0, 1 - warmup_frac], got {v['decay_frac']}",
        )
        need(0 <= v["min_lr_frac"] <= 1, "min_lr_frac.value", f"must be in [0, 1], got {v['min_lr_frac']}")
        if self.check is not None:
            _validate_check(self.check, f"{where}.check")
        return self


def _validate_check(c: RecipeCheckSpec, where: str) -> None:
    def need(ok: bool, key: str, message: str) -> None:
        if not ok:
            raise DelphiError(f"{where}.{key}: {message}")

    need(
        len(c.hero_computes) >= 1 and all(x > 0 and math.isfinite(x) for x in c.hero_computes),
        "hero_computes",
        f"need the positive computes (FLOPs) of the runs planned beyond the ladder, got {list(c.hero_computes)}",
    )
    need(len(set(c.widths)) >= 3, "widths", f"need >= 3 distinct widths (issue 29), got {list(c.widths)}")
    need(all(w >= 2 and w % 2 == 0 for w in c.widths), "widths", f"must be even widths, got {list(c.widths)}")
    need(c.width_tokens > 0, "width_tokens", f"must be a positive token count, got {c.width_tokens}")
    need(len(set(c.horizons)) >= 3, "horizons", f"need >= 3 distinct token horizons (issue 29), got {list(c.horizons)}")
    need(all(t > 0 for t in c.horizons), "horizons", f"must be positive token counts, got {list(c.horizons)}")
    need(
        c.horizon_width >= 2 and c.horizon_width % 2 == 0,
        "horizon_width",
        f"must be an even width, got {c.horizon_width}",
    )
    m = c.lr_multipliers
    need(
        len(set(m)) >= 5 and 1.0 in m and min(m) > 0,
        "lr_multipliers",
        f"need >= 5 distinct positive multipliers including 1 (the recipe's LR), got {list(m)}",
    )
    need(len(set(c.seeds)) >= 2 and min(c.seeds) >= 0, "seeds", f"need >= 2 distinct seeds >= 0, got {list(c.seeds)}")
    b = c.batch_multipliers
    need(
        len(set(b)) >= 2 and 1.0 not in b and min(b) > 0,
        "batch_multipliers",
        f"need >= 2 distinct positive multipliers other than 1, got {list(b)}",
    )


# The spec keys a recipe owns: set alongside `recipe:` they would be a second, silent source of
# batch, LR, beta2 or schedule, so `load_ladder_spec` refuses them (and the written ladder.yaml of a
# recipe spec leaves them out).
RECIPE_OWNED_KEYS = {
    "base": ("lr", "batch_tokens", "tokens", "weight_decay", "beta1", "beta2", "eps", "grad_clip"),
    "batch": ("rule", "min_steps", "min_seqs", "max_seqs"),
    "transfer": (
        "batch_exponent",
        "horizon_exponent",
        "width_exponent",
        "lr_max",
        "beta2",
        "schedule",
        "warmup_frac",
        "decay_frac",
        "decay_shape",
        "min_lr_frac",
    ),
}


def check_owned_keys(data: dict) -> None:
    """DelphiError naming the first key of a spec dict that a `recipe:` section owns."""
    if not isinstance(data, dict) or data.get("recipe") is None:
        return
    for section, keys in RECIPE_OWNED_KEYS.items():
        given = data.get(section)
        if isinstance(given, dict):
            for key in keys:
                if key in given:
                    raise DelphiError(f"{section}.{key}: set by the recipe (recipe: section); remove it from {section}")


def drop_owned_keys(data: dict) -> dict:
    """The spec dict without the keys its recipe owns (a recipe spec's ladder.yaml)."""
    if data.get("recipe") is None:
        data = dict(data)
        data.pop("recipe", None)  # an old spec's ladder.yaml stays byte-identical
        return data
    out = dict(data)
    for section, keys in RECIPE_OWNED_KEYS.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in keys}
    return out


def unsourced_constants(recipe: RecipeSpec) -> list[str]:
    """`recipe.<key>` of every constant without a source."""
    return [f"recipe.{k}" for k, c in recipe.constants().items() if not (c.source and str(c.source).strip())]


# ---- the forms ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecipeHyperparams:
    """What one run trains with under the recipe."""

    optimizer: str
    batch_seqs: int
    batch_tokens: int
    tokens: float  # the horizon the hyperparameters were set for
    lr: float  # AdamH: the matrices' relative step eta; AdamW: the LR
    adam_lr: float
    eps: float
    beta1: float
    beta2: float
    grad_clip: float
    weight_decay: float
    schedule: str
    warmup_frac: float
    decay_frac: float
    decay_shape: str
    min_lr_frac: float
    lr_batch_factor: float
    lr_horizon_factor: float
    lr_width_factor: float
    halvings: int  # times the fixed-step batch was halved for a cap
    caps: tuple[str, ...]  # caps still hit at the chosen batch (at min_seqs), clipped


def rule_batch_seqs(recipe: RecipeSpec, tokens: float, seq_len: int) -> int:
    """The fixed-step batch before caps: T / (seq_len x target_steps) rounded up to a power of two
    (batch_rounding pow2) or to the nearest whole number (nearest), within [min_seqs, max_seqs]."""
    if not (tokens > 0 and math.isfinite(tokens)):
        raise DelphiError(f"tokens: must be positive and finite, got {tokens!r}")
    exact = tokens / (seq_len * recipe.target_steps.value)
    if recipe.batch_rounding == "nearest":
        seqs = max(1, round(exact))
    else:
        seqs = 1 if exact <= 1 else 2 ** math.ceil(math.log2(exact) - 1e-12)
    return int(min(max(seqs, recipe.min_seqs), recipe.max_seqs))


def _width_factor(recipe: RecipeSpec, d_model: int | None) -> float:
    if recipe.width_exponent.value == 0:
        return 1.0
    if d_model is None:
        raise DelphiError(
            "recipe.width_exponent: the recipe has a width term, so its hyperparameters need the run's d_model"
        )
    return (d_model / recipe.ref_d_model.value) ** recipe.width_exponent.value


def _raw(recipe: RecipeSpec, batch_tokens: float, tokens: float, d_model: int | None) -> dict[str, float]:
    b0, t0 = recipe.ref_batch_tokens.value, recipe.ref_tokens.value
    batch_factor = (batch_tokens / b0) ** recipe.batch_exponent.value
    horizon_factor = (t0 / tokens) ** recipe.horizon_exponent.value
    width_factor = _width_factor(recipe, d_model)
    ratio = batch_tokens * t0 / (b0 * tokens)  # Marin's r / r0
    return {
        "lr": recipe.lr.value * batch_factor * horizon_factor * width_factor,
        "adam_lr": recipe.adam_lr.value * math.sqrt(ratio),
        "eps": recipe.eps.value / math.sqrt(ratio),
        "beta2": recipe.beta2.value ** (batch_tokens / b0),
        "lr_batch_factor": batch_factor,
        "lr_horizon_factor": horizon_factor,
        "lr_width_factor": width_factor,
    }


def caps_hit(recipe: RecipeSpec, batch_tokens: float, tokens: float, d_model: int | None = None) -> tuple[str, ...]:
    """The caps the forms exceed at this batch, horizon and width (each halves the batch)."""
    raw = _raw(recipe, batch_tokens, tokens, d_model)
    hit = []
    if raw["lr"] > recipe.lr_max.value:
        hit.append("lr_max")
    if raw["adam_lr"] > recipe.adam_lr_max.value:
        hit.append("adam_lr_max")
    if raw["beta2"] < recipe.beta2_min.value:
        hit.append("beta2_min")
    return tuple(hit)


def hyperparams_at(
    recipe: RecipeSpec, batch_seqs: int, seq_len: int, tokens: float, halvings: int = 0, d_model: int | None = None
) -> RecipeHyperparams:
    """The recipe's hyperparameters at a given batch and horizon (caps clipped, not halved): the
    batch sweep of the recipe check trains at batches the rule did not choose."""
    if batch_seqs < 1:
        raise DelphiError(f"batch: sequences per step must be >= 1, got {batch_seqs}")
    batch_tokens = batch_seqs * seq_len
    raw = _raw(recipe, batch_tokens, tokens, d_model)
    return RecipeHyperparams(
        optimizer=recipe.optimizer,
        batch_seqs=int(batch_seqs),
        batch_tokens=int(batch_tokens),
        tokens=float(tokens),
        lr=min(raw["lr"], recipe.lr_max.value),
        adam_lr=min(raw["adam_lr"], recipe.adam_lr_max.value),
        eps=raw["eps"],
        beta1=recipe.beta1.value,
        beta2=min(max(raw["beta2"], recipe.beta2_min.value), recipe.beta2_max.value),
        grad_clip=recipe.grad_clip.value,
        weight_decay=recipe.weight_decay.value,
        schedule=recipe.schedule,
        warmup_frac=recipe.warmup_frac.value,
        decay_frac=recipe.decay_frac.value,
        decay_shape=recipe.decay_shape,
        min_lr_frac=recipe.min_lr_frac.value,
        lr_batch_factor=raw["lr_batch_factor"],
        lr_horizon_factor=raw["lr_horizon_factor"],
        lr_width_factor=raw["lr_width_factor"],
        halvings=halvings,
        caps=caps_hit(recipe, batch_tokens, tokens, d_model),
    )


def recipe_batch_seqs(recipe: RecipeSpec, tokens: float, seq_len: int, d_model: int | None = None) -> tuple[int, int]:
    """(sequences per step, halvings): the fixed-step batch, halved while a cap is hit."""
    seqs, halvings = rule_batch_seqs(recipe, tokens, seq_len), 0
    while seqs > recipe.min_seqs and caps_hit(recipe, seqs * seq_len, tokens, d_model):
        seqs //= 2
        halvings += 1
    return max(seqs, recipe.min_seqs), halvings


def recipe_for_tokens(
    recipe: RecipeSpec, tokens: float, seq_len: int, batch_seqs: int | None = None, d_model: int | None = None
) -> RecipeHyperparams:
    """THE recipe: everything a run of `tokens` tokens at width `d_model` trains with (the width is
    needed only with a width term). `batch_seqs` overrides the batch rule (the recipe check's batch
    sweep only); the hyperparameters follow the batch either way."""
    if batch_seqs is not None:
        return hyperparams_at(recipe, batch_seqs, seq_len, tokens, d_model=d_model)
    seqs, halvings = recipe_batch_seqs(recipe, tokens, seq_len, d_model)
    return hyperparams_at(recipe, seqs, seq_len, tokens, halvings, d_model)


def trainer_has_optimizer_choice() -> bool:
    """Whether delphi.train.config.OptimConfig takes `optimizer` and `adam_lr` (the AdamH trainer)."""

    names = {f.name for f in dataclasses.fields(OptimConfig)}
    return {"optimizer", "adam_lr"} <= names


def optim_config(hp: RecipeHyperparams, lr: float | None = None) -> "OptimConfig":
    """The trainer's optim section for these hyperparameters (`lr` overrides the projection LR)."""

    kwargs: dict = dict(
        lr=hp.lr if lr is None else lr,
        weight_decay=hp.weight_decay,
        beta1=hp.beta1,
        beta2=hp.beta2,
        eps=hp.eps,
        grad_clip=hp.grad_clip,
        schedule=hp.schedule,
        warmup_frac=hp.warmup_frac,
        decay_frac=hp.decay_frac,
        decay_shape=hp.decay_shape,
        min_lr_frac=hp.min_lr_frac,
    )
    if trainer_has_optimizer_choice():
        kwargs["optimizer"] = hp.optimizer
        if hp.optimizer == "adamh":
            kwargs["adam_lr"] = hp.adam_lr
    elif hp.optimizer != "adamw":
        raise DelphiError(
            f"recipe.optimizer: {hp.optimizer}: this trainer has no such optimizer "
            "(delphi.train.config.OptimConfig takes no `optimizer`)"
        )
    return OptimConfig(**kwargs)
