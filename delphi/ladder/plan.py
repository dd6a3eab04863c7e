"""Planning a ladder: shapes, tokens, batch and transferred hyperparameters per rung.

    shape_for_width(spec, d)        -> ModelConfig   (the shape family)
    batch_for_tokens(spec, tokens)  -> sequences per step
    transfer(spec, d, batch_tokens, tokens) -> Hyperparams
    make_rung(spec, model, budget, seed)    -> Rung    (tokens from the exact FLOPs/token)
    plan_ladder(spec)               -> list[Rung]
    write_ladder(spec, rungs, out)  -> manifest rows (delphi.ladder.manifest: configs/*.yaml + manifest.csv + ladder.yaml)
    plan_hero(spec, params, compute, seed) -> Rung   (delphi.ladder.hero: inside the ladder's ranges when it can be)
    hero_ranges(spec, hero, results) -> dict       (delphi.ladder.hero: the hero against the ladder's ranges)
    flops_family(spec, convention)  -> FlopsFamily (delphi.ladder.family: exact FLOPs per token against N)

A rung's tokens are budget / flops_per_token (exact, docs/design.md §4.5), its
batch the largest power of two of sequences that still leaves >= min_steps
steps, and its steps round(tokens / batch tokens): the achieved FLOPs are then
within 1 / (2 * min_steps) of the budget, and the plan checks the spec's
tolerance anyway.

Under a spec's `recipe:` every run -- rung, anchor, calibration or recipe-check point,
rehearsal, probe, hero -- takes its batch and hyperparameters from delphi.ladder.recipe
(inside `make_rung`), each from its own tokens: no one-batch-per-budget rule and no clip to
the top budget's batch, so nothing switches between the ladder and the hero.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass

from delphi.errors import DelphiError
from delphi.fits.data import ANCHOR_ROLE
from delphi.ladder.recipe import RecipeHyperparams, optim_config, recipe_batch_seqs, recipe_for_tokens
from delphi.ladder.spec import LadderSpec
from delphi.model.config import ModelConfig, MoEConfig, MuPConfig
from delphi.model.flops import count_params, flops_per_token
from delphi.train.config import DataConfig, OptimConfig, TrainConfig

# ---- shape family -------------------------------------------------------------------------------


def rule_layers(spec: LadderSpec, d_model: int) -> int:
    """The depth rule's layers at `d_model`, before shape.depth's min_layers and max_layers."""
    depth = spec.shape.depth
    if depth.rule == "marin":
        # Marin scaling_laws recipe: layers = round(d / (64 + 4 log2 d - 9))
        raw = d_model / (64 + 4 * math.log2(d_model) - 9)
    else:
        raw = d_model / depth.ratio
    return int(round(raw))


def layers_for_width(spec: LadderSpec, d_model: int) -> int:
    depth = spec.shape.depth
    layers = max(rule_layers(spec, d_model), depth.min_layers)
    return layers if depth.max_layers is None else min(layers, depth.max_layers)


def heads_for_width(d_model: int, head_dim: int) -> int:
    """Heads ~ d / head_dim, adjusted to divide d with an even head size (RoPE)."""
    target = max(1, round(d_model / head_dim))
    for delta in range(d_model):
        for heads in (target - delta, target + delta):
            if 1 <= heads <= d_model and d_model % heads == 0 and (d_model // heads) % 2 == 0:
                return heads
    raise DelphiError(f"shape.widths: no head count gives an even head size for d_model={d_model}")


def _round_up(x: float, multiple: int) -> int:
    return max(multiple, int(math.ceil(x / multiple - 1e-9)) * multiple)


def shape_for_width(spec: LadderSpec, d_model: int) -> ModelConfig:
    """The family's shape at `d_model` (a spec that sweeps experts or granularity: one of `spec.variants()`)."""
    s, base, t = spec.single_family("a shape of the family").shape, spec.base, spec.transfer
    d_ff = _round_up(s.ffn_mult * d_model, s.ffn_multiple)
    moe = None
    if s.moe is not None:
        m = s.moe
        moe = MoEConfig(
            experts=m.experts,
            top_k=m.top_k,
            d_expert=_round_up(s.ffn_mult * d_model / m.granularity, s.ffn_multiple),
            shared_experts=m.shared_experts,
            score=m.score,
            balance=m.balance,
            bias_update_rate=m.bias_update_rate,
            aux_loss_weight=m.aux_loss_weight,
            z_loss_weight=m.z_loss_weight,
            capacity_factor=m.capacity_factor,
        )
    mup = MuPConfig(
        enabled=t.mup,
        base_d_model=base.d_model,
        base_n_layers=base.n_layers,
        init_std=base.init_std,
        alpha_in=base.alpha_in,
        alpha_out=base.alpha_out,
        depth_transfer=t.depth_transfer,
    )
    cfg = ModelConfig(
        vocab_size=spec.vocab_size,
        d_model=d_model,
        n_layers=layers_for_width(spec, d_model),
        n_heads=s.n_heads if s.n_heads is not None else heads_for_width(d_model, s.head_dim),
        d_ff=d_ff,
        moe=moe,
        mup=mup,
    )
    return cfg.validate(f"shape (d_model={d_model})")


# ---- batch and hyperparameter transfer ----------------------------------------------------------


@dataclass(frozen=True)
class RecipeRun:
    model: ModelConfig
    tokens: float
    steps: int
    hp: "RecipeHyperparams"


def recipe_run(spec: LadderSpec, width_or_model: int | ModelConfig, tokens: float) -> RecipeRun:
    """Shape (the spec's family at this width), batch, steps and hyperparameters of a run of
    `tokens` tokens: the whole mapping in one call (steps before the plan's step quantum)."""

    if spec.recipe is None:
        raise DelphiError("recipe: the ladder spec has no recipe section")
    model = shape_for_width(spec, width_or_model) if isinstance(width_or_model, int) else width_or_model
    hp = recipe_for_tokens(spec.recipe, tokens, spec.seq_len, d_model=model.d_model)
    steps = max(1, round(tokens / hp.batch_tokens))
    return RecipeRun(model, tokens, steps, hp)


def batch_for_tokens(spec: LadderSpec, tokens: float) -> int | None:
    """Sequences per step: the largest power of two leaving >= min_steps steps, clipped.

    None when even the smallest allowed batch leaves fewer than min_steps steps.
    """
    b = spec.batch
    per_step = tokens / (b.min_steps * spec.seq_len)
    if per_step < b.min_seqs:
        return None
    seqs = 2 ** int(math.floor(math.log2(per_step)))
    return int(min(max(seqs, b.min_seqs), b.max_seqs))


@dataclass(frozen=True)
class Hyperparams:
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip: float
    lr_batch_factor: float  # the corrections applied to base.lr, for the manifest
    lr_horizon_factor: float
    lr_width_factor: float
    # Set under a spec's `recipe:` (delphi.ladder.recipe), which adds them to the manifest.
    recipe: "RecipeHyperparams | None" = None


def transfer(spec: LadderSpec, d_model: int, batch_tokens: int, tokens: float) -> Hyperparams:
    """The rung's hyperparameters from the base's by the spec's recipe.

    muP itself (hidden LR eta/m, init, output multiplier, CompleteP eps) is applied
    inside the model and optimizer from ModelConfig.mup; this adds the empirical
    batch-size, token-horizon and (optional) extra width corrections to the base LR.
    """
    base, t = spec.base, spec.transfer
    batch_factor = (batch_tokens / base.batch_tokens) ** t.batch_exponent
    horizon_factor = (base.tokens / tokens) ** t.horizon_exponent
    width_factor = (d_model / base.d_model) ** (-t.width_exponent)
    lr = min(base.lr * batch_factor * horizon_factor * width_factor, t.lr_max)
    b2 = t.beta2
    if b2.rule == "batch_power":
        anchor = b2.anchor if b2.anchor is not None else base.beta2
        ref = b2.ref_batch_tokens if b2.ref_batch_tokens is not None else base.batch_tokens
        beta2 = min(max(anchor ** (batch_tokens / ref), b2.min), b2.max)
    else:
        beta2 = base.beta2
    return Hyperparams(
        lr=lr,
        beta1=base.beta1,
        beta2=beta2,
        eps=base.eps,
        weight_decay=base.weight_decay,
        grad_clip=base.grad_clip,
        lr_batch_factor=batch_factor,
        lr_horizon_factor=horizon_factor,
        lr_width_factor=width_factor,
    )


# ---- rungs --------------------------------------------------------------------------------------


# The trainer fuses up to 8 steps per jitted call when the step count and the log/eval/checkpoint
# periods share that divisor (delphi.train.trainer.MAX_STEPS_PER_CALL).
MAX_STEP_QUANTUM = 8


def step_quantum(steps: float, tolerance: float) -> int:
    """Largest power of two <= MAX_STEP_QUANTUM whose rounding error stays within tolerance / 2."""
    q = MAX_STEP_QUANTUM
    while q > 1 and q > tolerance * steps:
        q //= 2
    return q


class TooManySteps(DelphiError):
    """A run past batch.max_steps: a units mistake in the budgets, or a shape too small for its budget."""


@dataclass(frozen=True)
class Rung:
    run_id: str
    budget: float
    seed: int
    model: ModelConfig
    flops_per_token: float
    steps: int
    batch_size: int  # sequences per step
    hp: Hyperparams
    train: TrainConfig

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.train.data.seq_len

    @property
    def flops(self) -> float:
        return self.tokens * self.flops_per_token

    @property
    def params(self) -> int:
        """N: active non-embedding parameters (the canonical `params` column)."""
        return count_params(self.model).nonembedding


def format_budget(budget: float) -> str:
    mantissa, exponent = f"{budget:.3g}".split("e") if "e" in f"{budget:.3g}" else (f"{budget:.3g}", "0")
    return f"{mantissa}e{int(exponent)}"


def cell_id_for(budget: float, model: ModelConfig, granularity: float | None = None) -> str:
    """A cell is one (budget, shape): the runs of its seeds share it. `granularity` (a ladder that
    sweeps it) joins the id, so that shapes differing only in their experts' width stay apart."""
    moe = f"_E{model.moe.experts}k{model.moe.top_k}" if model.moe is not None else ""
    moe += f"G{granularity:g}" if model.moe is not None and granularity is not None else ""
    return f"C{format_budget(budget)}_d{model.d_model}_L{model.n_layers}{moe}"


def run_id_for(budget: float, model: ModelConfig, seed: int, granularity: float | None = None) -> str:
    return f"{cell_id_for(budget, model, granularity)}_s{seed}"


ANCHOR_PREFIX = "A"  # run ids of anchor rungs (spec `anchors`) start with it; isoFLOP rungs' with "C"


def anchor_run_id(budget: float, model: ModelConfig, seed: int, granularity: float | None = None) -> str:
    return ANCHOR_PREFIX + run_id_for(budget, model, seed, granularity)[1:]


def rung_role(run_id: str) -> str:
    """ "anchor" for a long rung of the spec's `anchors`, else "isoflop" (the results column `role`)."""
    return ANCHOR_ROLE if run_id.startswith(ANCHOR_PREFIX) else "isoflop"


def cell_id_of(run_id: str) -> str:
    """The cell of a run id written by run_id_for (its seed suffix removed)."""
    return re.sub(r"_s\d+$", "", run_id)


def rung_tokens(model: ModelConfig, seq_len: int, budget: float) -> tuple[float, float]:
    fpt = flops_per_token(model, seq_len)
    return fpt, budget / fpt


def make_rung(
    spec: LadderSpec, model: ModelConfig, budget: float, seed: int, run_id: str | None = None, batch: int | None = None
) -> Rung | None:
    """The rung training `model` on exactly `budget` FLOPs, or None when it cannot get min_steps steps.

    `batch` (sequences per step) overrides the rung's own batch rule (used for one batch per budget).
    Under a spec's `recipe:` the batch is the recipe's for these tokens (`batch` overrides it only for
    the recipe check's batch sweep) and every hyperparameter is the recipe's (delphi.ladder.recipe).
    """
    fpt, tokens = rung_tokens(model, spec.seq_len, budget)
    halvings = 0
    if spec.recipe is not None:
        rule_batch, rule_halvings = recipe_batch_seqs(spec.recipe, tokens, spec.seq_len, model.d_model)
        batch = batch if batch is not None else rule_batch
        halvings = rule_halvings if batch == rule_batch else 0
    else:
        batch = batch if batch is not None else batch_for_tokens(spec, tokens)
    if batch is None:
        return None
    steps_raw = tokens / (batch * spec.seq_len)
    if steps_raw > spec.batch.max_steps:
        raise TooManySteps(
            f"budgets: {budget:g} FLOPs gives d_model={model.d_model} {steps_raw:.3g} steps of {batch} sequences, "
            f"past batch.max_steps={spec.batch.max_steps:,}; budgets are FLOPs (e.g. 1.0e+12), or raise batch.max_seqs"
        )
    q = step_quantum(steps_raw, spec.tolerance)
    steps = max(q, q * round(steps_raw / q))
    batch_tokens = batch * spec.seq_len
    run = spec.run
    t = spec.transfer
    run_id = run_id or run_id_for(budget, model, seed)
    if spec.recipe is not None:
        # Hyperparameters for the horizon the run trains (steps x batch), as the transfer rule's.
        rhp = recipe_for_tokens(
            spec.recipe, steps * batch_tokens, spec.seq_len, batch_seqs=batch, d_model=model.d_model
        )
        rhp = dataclasses.replace(rhp, halvings=halvings)
        hp = Hyperparams(
            lr=rhp.lr,
            beta1=rhp.beta1,
            beta2=rhp.beta2,
            eps=rhp.eps,
            weight_decay=rhp.weight_decay,
            grad_clip=rhp.grad_clip,
            lr_batch_factor=rhp.lr_batch_factor,
            lr_horizon_factor=rhp.lr_horizon_factor,
            lr_width_factor=rhp.lr_width_factor,
            recipe=rhp,
        )
        optim = optim_config(rhp)
    else:
        hp = transfer(spec, model.d_model, batch_tokens, steps * batch_tokens)
        optim = OptimConfig(
            lr=hp.lr,
            weight_decay=hp.weight_decay,
            beta1=hp.beta1,
            beta2=hp.beta2,
            eps=hp.eps,
            grad_clip=hp.grad_clip,
            schedule=t.schedule,
            warmup_frac=t.warmup_frac,
            decay_frac=t.decay_frac,
            decay_shape=t.decay_shape,
            min_lr_frac=t.min_lr_frac,
        )
    # Evenly spaced events on multiples of q, so the trainer can fuse q steps per call.
    every = lambda n: q * max(1, math.ceil(steps / (n * q)))  # noqa: E731
    train = TrainConfig(
        model=model,
        data=DataConfig(store=run.store, seq_len=spec.seq_len, batch_size=batch, seed=seed),
        optim=optim,
        steps=steps,
        seed=seed,
        precision=run.precision,
        log_every=every(run.logs_per_run),
        eval_every=every(run.evals_per_run),
        eval_tokens=run.eval_tokens,
        final_eval_tokens=run.final_eval_tokens,
        checkpoint_every=every(run.checkpoints_per_run),
        keep_checkpoints=run.keep_checkpoints,
        name=run_id,
    ).validate()
    return Rung(run_id, budget, seed, model, fpt, steps, batch, hp, train)


def _shapes(spec: LadderSpec) -> list[ModelConfig]:
    shapes = [shape_for_width(spec, w) for w in sorted(spec.shape.widths)]
    return sorted(shapes, key=lambda m: count_params(m).nonembedding)


def expected_optimum(spec: LadderSpec, budget: float) -> float:
    """N* the spec expects at `budget` (active non-embedding): isoflop.center_at, else the family's N
    at isoflop.center_tokens_per_param, else center_coefficient x budget^center_exponent."""
    iso = spec.isoflop
    assert iso is not None
    for budget_at, n_star in iso.center_at:
        if math.isclose(budget, budget_at, rel_tol=1e-9):
            return n_star
    if iso.center_tokens_per_param is not None:
        return params_at_tokens_per_param(spec, budget, iso.center_tokens_per_param)
    return iso.center_coefficient * budget**iso.center_exponent


@functools.lru_cache(maxsize=256)
def params_at_tokens_per_param(spec: LadderSpec, budget: float, ratio: float) -> float:
    """The family's N (active non-embedding) that trains `ratio` tokens per parameter on `budget` FLOPs
    under its exact FLOPs per token: bisection over the widths the family can take (even, and split
    into shape.n_heads even heads when that is fixed), then log-linear between the two widths that
    bracket the ratio (tokens per parameter falls as the width grows)."""
    step = 2 * (spec.shape.n_heads or 1)

    def point(k: int) -> tuple[float, float]:
        model = shape_for_width(spec, step * k)
        n = count_params(model).nonembedding
        return n, budget / flops_per_token(model, spec.seq_len) / n

    lo, hi = 1, max(2, (1 << 20) // step)  # widths step .. 2^20
    if point(lo)[1] <= ratio:
        return point(lo)[0]
    if point(hi)[1] >= ratio:
        return point(hi)[0]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if point(mid)[1] > ratio else (lo, mid)
    (n_lo, r_lo), (n_hi, r_hi) = point(lo), point(hi)
    if n_hi == n_lo or r_hi == r_lo:
        return n_lo
    frac = math.log(ratio / r_lo) / math.log(r_hi / r_lo)
    return math.exp(math.log(n_lo) + frac * math.log(n_hi / n_lo))


def _pick_isoflop(spec: LadderSpec, i: int, budget: float, shapes: list[ModelConfig]) -> list[ModelConfig]:
    iso = spec.isoflop
    assert iso is not None
    feasible, too_long = [], None
    for m in shapes:
        try:
            if make_rung(spec, m, budget, 0) is not None:
                feasible.append(m)
        except TooManySteps as e:  # a shape too small for this budget: the others may still fit
            too_long = e
    if not feasible and too_long is not None:
        raise too_long
    if not feasible:
        smallest = shapes[0]
        _, tokens = rung_tokens(smallest, spec.seq_len, budget)
        need = spec.batch.min_steps * spec.batch.min_seqs * spec.seq_len
        raise DelphiError(
            f"budgets[{i}]: {budget:g} FLOPs is too small for the smallest shape (d_model={smallest.d_model}): "
            f"it gives {tokens:,.0f} tokens, batch.min_steps x batch.min_seqs x seq_len needs {need:,}"
        )
    center = expected_optimum(spec, budget)
    log_n = {id(m): math.log(count_params(m).nonembedding) for m in feasible}
    picked: list[ModelConfig] = []
    for k in range(iso.sizes):
        frac = k / (iso.sizes - 1) - 0.5
        target = math.log(center) + frac * math.log(iso.span)
        options = [m for m in feasible if all(m is not p for p in picked)]
        if not options:
            break
        picked.append(min(options, key=lambda m: abs(log_n[id(m)] - target)))
    picked.sort(key=lambda m: count_params(m).nonembedding)
    if len(picked) < iso.sizes:
        raise DelphiError(
            f"shape.widths: budget {budget:g} (budgets[{i}]) needs {iso.sizes} sizes but only "
            f"{len(picked)} widths can meet it with >= batch.min_steps steps; add widths or lower isoflop.sizes"
        )
    n = [count_params(m).nonembedding for m in picked]
    achieved = n[-1] / n[0]
    if achieved < iso.min_span * (1 - 1e-9):
        raise DelphiError(
            f"shape.widths: at budget {budget:g} (budgets[{i}]) the chosen sizes span only {achieved:.1f}x in N "
            f"({n[0]:,} to {n[-1]:,}; isoflop.min_span is {iso.min_span:g}); add widths around N* ~ {center:,.0f}"
        )
    return picked


def _pick_tokens_per_param(spec: LadderSpec, i: int, budget: float, shapes: list[ModelConfig]) -> list[ModelConfig]:
    tp = spec.tokens_per_param
    assert tp is not None

    def ratio(m: ModelConfig) -> float:
        return rung_tokens(m, spec.seq_len, budget)[1] / count_params(m).nonembedding

    best = min(shapes, key=lambda m: abs(math.log(ratio(m) / tp.ratio)))
    if abs(ratio(best) / tp.ratio - 1) > tp.max_ratio_error:
        raise DelphiError(
            f"shape.widths: no width gives {tp.ratio:g} tokens per parameter at budget {budget:g} (budgets[{i}]); "
            f"the closest (d_model={best.d_model}) gives {ratio(best):.1f}"
        )
    if make_rung(spec, best, budget, 0) is None:
        raise DelphiError(
            f"budgets[{i}]: {budget:g} FLOPs gives d_model={best.d_model} fewer than batch.min_steps steps "
            f"at batch.min_seqs={spec.batch.min_seqs}"
        )
    return [best]


def plan_ladder(spec: LadderSpec) -> list[Rung]:
    """Every rung of the spec: each budget's sizes (and seeds), then its anchors; a spec that sweeps
    experts or granularity plans them for each (experts, granularity) in turn (`LadderSpec.variants`)."""
    m = spec.shape.moe
    tag_granularity = m is not None and len(m.granularities) > 1
    rungs: list[Rung] = []
    for variant in spec.variants():
        g = variant.shape.moe.granularity if tag_granularity else None  # type: ignore[union-attr]
        rungs += _plan_family(variant, g)
    check_tokens_per_param_floor(spec, rungs)
    ids = [r.run_id for r in rungs]
    assert len(set(ids)) == len(ids), "run ids must be unique"
    return rungs


def _plan_family(spec: LadderSpec, granularity: float | None) -> list[Rung]:
    shapes = _shapes(spec)
    rungs: list[Rung] = []
    for i, budget in enumerate(spec.budgets):
        if spec.mode == "isoflop":
            models = _pick_isoflop(spec, i, budget, shapes)
        else:
            models = _pick_tokens_per_param(spec, i, budget, shapes)
        batch = None
        if spec.batch.rule == "budget" and spec.recipe is None:  # a recipe sizes every run's batch itself
            # The rung with the fewest tokens sets the batch: every rung then gets >= min_steps.
            fewest = min(rung_tokens(m, spec.seq_len, budget)[1] for m in models)
            batch = batch_for_tokens(spec, fewest)
        for model in models:
            for seed in spec.seeds_for(budget):
                rung = make_rung(
                    spec, model, budget, seed, batch=batch, run_id=run_id_for(budget, model, seed, granularity)
                )
                assert rung is not None
                error = rung.flops / budget - 1
                if abs(error) > spec.tolerance:
                    raise DelphiError(
                        f"tolerance: rung {rung.run_id} reaches {rung.flops:.4g} FLOPs, {error:+.2%} from its budget "
                        f"(allowed {spec.tolerance:.2%}); raise batch.min_steps"
                    )
                rungs.append(rung)
    return rungs + plan_anchors(spec, rungs, granularity)


def check_tokens_per_param_floor(spec: LadderSpec, rungs: list[Rung]) -> None:
    """DelphiError naming the first rung below bounds.min_tokens_per_param (an absurd plan)."""
    floor = spec.bounds.min_tokens_per_param
    if floor is None:
        return
    low = [r for r in rungs if r.tokens / r.params < floor]
    if low:
        worst = min(low, key=lambda r: r.tokens / r.params)
        raise DelphiError(
            f"bounds.min_tokens_per_param: rung {worst.run_id} would train {worst.tokens / worst.params:.2g} tokens per "
            f"parameter (N={worst.params:,}, D={worst.tokens:,}; {len(low)} of {len(rungs)} rungs are below {floor:g}); "
            "its budget is too small for its width: lower the widths (shape.widths) or the expected optimum (isoflop.center_*)"
        )


def plan_anchors(spec: LadderSpec, rungs: list[Rung], granularity: float | None = None) -> list[Rung]:
    """The spec's anchor rungs: each of `anchors.widths` on `anchors.multiple` x the top budget, at
    the top budget's batch (so the hero's batch continues theirs too) and (the first `anchors.seeds`
    of) its seeds."""
    if spec.anchors is None:
        return []
    top = max(spec.budgets)
    # Under a recipe every run takes the recipe's batch for its own tokens (one batch rule throughout).
    top_batch = max(r.batch_size for r in rungs if r.budget == top) if spec.recipe is None else None
    budget = spec.anchors.multiple * top
    out = []
    for width in spec.anchors.widths:
        model = shape_for_width(spec, width)
        for seed in spec.seeds_for(top)[: spec.anchors.seeds]:
            rung = make_rung(
                spec, model, budget, seed, run_id=anchor_run_id(budget, model, seed, granularity), batch=top_batch
            )
            if rung is None:
                raise DelphiError(
                    f"anchors.widths: d_model={width} gets fewer than batch.min_steps steps on {budget:g} FLOPs"
                )
            out.append(rung)
    return out
