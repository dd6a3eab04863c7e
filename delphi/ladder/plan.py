"""Planning a ladder: shapes, tokens, batch and transferred hyperparameters per rung.

    shape_for_width(spec, d)        -> ModelConfig   (the shape family)
    batch_for_tokens(spec, tokens)  -> sequences per step
    transfer(spec, d, batch_tokens, tokens) -> Hyperparams
    make_rung(spec, model, budget, seed)    -> Rung    (tokens from the exact FLOPs/token)
    plan_ladder(spec)               -> list[Rung]
    write_ladder(spec, rungs, out)  -> manifest rows (configs/*.yaml + manifest.csv + ladder.yaml)
    plan_hero(spec, params, compute, seed) -> Rung

A rung's tokens are budget / flops_per_token (exact, DESIGN.md section 4), its
batch the largest power of two of sequences that still leaves >= min_steps
steps, and its steps round(tokens / batch tokens): the achieved FLOPs are then
within 1 / (2 * min_steps) of the budget, and the plan checks the spec's
tolerance anyway.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from delphi.errors import DelphiError
from delphi.io import atomic_write_text, atomic_write_yaml
from delphi.ladder.spec import LadderSpec, ladder_spec_to_dict
from delphi.model.config import ModelConfig, MoEConfig, MuPConfig
from delphi.model.flops import count_params, flops_per_token
from delphi.train.config import DataConfig, OptimConfig, TrainConfig, train_config_to_dict

MANIFEST_FILE = "manifest.csv"
SPEC_FILE = "ladder.yaml"
CONFIG_DIR = "configs"
RUNS_DIR = "runs"


# ---- shape family -------------------------------------------------------------------------------


def layers_for_width(spec: LadderSpec, d_model: int) -> int:
    depth = spec.shape.depth
    if depth.rule == "marin":
        # Marin scaling_laws recipe: layers = round(d / (64 + 4 log2 d - 9))
        raw = d_model / (64 + 4 * math.log2(d_model) - 9)
    else:
        raw = d_model / depth.ratio
    return int(min(max(round(raw), depth.min_layers), depth.max_layers))


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
    s, base, t = spec.shape, spec.base, spec.transfer
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
        n_heads=heads_for_width(d_model, s.head_dim),
        d_ff=d_ff,
        moe=moe,
        mup=mup,
    )
    return cfg.validate(f"shape (d_model={d_model})")


# ---- batch and hyperparameter transfer ----------------------------------------------------------


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


def run_id_for(budget: float, model: ModelConfig, seed: int) -> str:
    moe = f"_E{model.moe.experts}k{model.moe.top_k}" if model.moe is not None else ""
    return f"C{format_budget(budget)}_d{model.d_model}_L{model.n_layers}{moe}_s{seed}"


def rung_tokens(model: ModelConfig, seq_len: int, budget: float) -> tuple[float, float]:
    fpt = flops_per_token(model, seq_len)
    return fpt, budget / fpt


def make_rung(
    spec: LadderSpec, model: ModelConfig, budget: float, seed: int, run_id: str | None = None, batch: int | None = None
) -> Rung | None:
    """The rung training `model` on exactly `budget` FLOPs, or None when it cannot get min_steps steps.

    `batch` (sequences per step) overrides the rung's own batch rule (used for one batch per budget).
    """
    fpt, tokens = rung_tokens(model, spec.seq_len, budget)
    batch = batch if batch is not None else batch_for_tokens(spec, tokens)
    if batch is None:
        return None
    steps_raw = tokens / (batch * spec.seq_len)
    q = step_quantum(steps_raw, spec.tolerance)
    steps = max(q, q * round(steps_raw / q))
    batch_tokens = batch * spec.seq_len
    hp = transfer(spec, model.d_model, batch_tokens, steps * batch_tokens)
    run = spec.run
    t = spec.transfer
    run_id = run_id or run_id_for(budget, model, seed)
    # Evenly spaced events on multiples of q, so the trainer can fuse q steps per call.
    every = lambda n: q * max(1, math.ceil(steps / (n * q)))  # noqa: E731
    train = TrainConfig(
        model=model,
        data=DataConfig(store=run.store, seq_len=spec.seq_len, batch_size=batch, seed=seed),
        optim=OptimConfig(
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
        ),
        steps=steps,
        seed=seed,
        precision=run.precision,
        log_every=every(run.logs_per_run),
        eval_every=every(run.evals_per_run),
        eval_tokens=run.eval_tokens,
        checkpoint_every=every(run.checkpoints_per_run),
        keep_checkpoints=run.keep_checkpoints,
        name=run_id,
    ).validate()
    return Rung(run_id, budget, seed, model, fpt, steps, batch, hp, train)


def _shapes(spec: LadderSpec) -> list[ModelConfig]:
    shapes = [shape_for_width(spec, w) for w in sorted(spec.shape.widths)]
    return sorted(shapes, key=lambda m: count_params(m).nonembedding)


def expected_optimum(spec: LadderSpec, budget: float) -> float:
    iso = spec.isoflop
    assert iso is not None
    return iso.center_coefficient * budget**iso.center_exponent


def _pick_isoflop(spec: LadderSpec, i: int, budget: float, shapes: list[ModelConfig]) -> list[ModelConfig]:
    iso = spec.isoflop
    assert iso is not None
    feasible = [m for m in shapes if make_rung(spec, m, budget, 0) is not None]
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
    shapes = _shapes(spec)
    rungs: list[Rung] = []
    for i, budget in enumerate(spec.budgets):
        if spec.mode == "isoflop":
            models = _pick_isoflop(spec, i, budget, shapes)
        else:
            models = _pick_tokens_per_param(spec, i, budget, shapes)
        batch = None
        if spec.batch.rule == "budget":
            # The rung with the fewest tokens sets the batch: every rung then gets >= min_steps.
            fewest = min(rung_tokens(m, spec.seq_len, budget)[1] for m in models)
            batch = batch_for_tokens(spec, fewest)
        for model in models:
            for seed in spec.run.seeds:
                rung = make_rung(spec, model, budget, seed, batch=batch)
                assert rung is not None
                error = rung.flops / budget - 1
                if abs(error) > spec.tolerance:
                    raise DelphiError(
                        f"tolerance: rung {rung.run_id} reaches {rung.flops:.4g} FLOPs, {error:+.2%} from its budget "
                        f"(allowed {spec.tolerance:.2%}); raise batch.min_steps"
                    )
                rungs.append(rung)
    ids = [r.run_id for r in rungs]
    assert len(set(ids)) == len(ids), "run ids must be unique"
    return rungs


# ---- hero ---------------------------------------------------------------------------------------


def plan_hero(spec: LadderSpec, params: float, compute: float, seed: int = 0) -> Rung:
    """The shape of the family closest (in log N) to `params`, trained on exactly `compute` FLOPs."""
    if not (params > 0 and compute > 0):
        raise DelphiError(f"hero: params and compute must be positive, got {params:g}, {compute:g}")
    multiple = spec.shape.hero_width_multiple
    widths = set(spec.shape.widths)
    # Grow the grid until it passes the target, so any N* has a neighbour on both sides.
    w = multiple
    while True:
        widths.add(w)
        if count_params(shape_for_width(spec, w)).nonembedding > 2 * params or w > 1 << 16:
            break
        w += multiple
    shapes = [shape_for_width(spec, w) for w in sorted(widths)]
    best = min(shapes, key=lambda m: abs(math.log(count_params(m).nonembedding / params)))
    rung = make_rung(spec, best, compute, seed, run_id=f"hero_C{format_budget(compute)}_d{best.d_model}_L{best.n_layers}_s{seed}")
    if rung is None:
        raise DelphiError(f"--compute: {compute:g} FLOPs gives the hero (d_model={best.d_model}) fewer than batch.min_steps steps")
    return rung


# ---- manifest -----------------------------------------------------------------------------------

MANIFEST_COLUMNS = (
    "run_id", "budget", "seed", "flops", "flops_error", "flops_6nd", "params", "params_active", "params_total",
    "params_nonembedding", "tokens", "tokens_per_param", "steps", "batch_size", "batch_tokens", "seq_len",
    "d_model", "n_layers", "n_heads", "d_head", "d_ff", "experts", "top_k", "d_expert", "granularity",
    "shared_experts", "flops_per_token", "lr", "lr_batch_factor", "lr_horizon_factor", "lr_width_factor",
    "beta1", "beta2", "eps", "weight_decay", "grad_clip", "schedule", "warmup_frac", "decay_frac",
    "mup_base_d_model", "mup_base_n_layers", "config",
)


def manifest_row(rung: Rung) -> dict[str, object]:
    m, counts, o = rung.model, count_params(rung.model), rung.train.optim
    moe = m.moe
    return {
        "run_id": rung.run_id,
        "budget": rung.budget,
        "seed": rung.seed,
        "flops": rung.flops,
        "flops_error": rung.flops / rung.budget - 1,
        "flops_6nd": 6.0 * counts.nonembedding * rung.tokens,
        "params": counts.nonembedding,
        "params_active": counts.active,
        "params_total": counts.total,
        "params_nonembedding": counts.nonembedding,
        "tokens": rung.tokens,
        "tokens_per_param": rung.tokens / counts.nonembedding,
        "steps": rung.steps,
        "batch_size": rung.batch_size,
        "batch_tokens": rung.batch_size * rung.train.data.seq_len,
        "seq_len": rung.train.data.seq_len,
        "d_model": m.d_model,
        "n_layers": m.n_layers,
        "n_heads": m.n_heads,
        "d_head": m.d_head,
        "d_ff": m.d_ff if moe is None else moe.d_active_ffn,
        "experts": moe.experts if moe else 0,
        "top_k": moe.top_k if moe else 0,
        "d_expert": moe.d_expert if moe else 0,
        "granularity": (m.d_ff / moe.d_expert) if moe else 0,
        "shared_experts": moe.shared_experts if moe else 0,
        "flops_per_token": rung.flops_per_token,
        "lr": o.lr,
        "lr_batch_factor": rung.hp.lr_batch_factor,
        "lr_horizon_factor": rung.hp.lr_horizon_factor,
        "lr_width_factor": rung.hp.lr_width_factor,
        "beta1": o.beta1,
        "beta2": o.beta2,
        "eps": o.eps,
        "weight_decay": o.weight_decay,
        "grad_clip": o.grad_clip,
        "schedule": o.schedule,
        "warmup_frac": o.warmup_frac,
        "decay_frac": o.decay_frac,
        "mup_base_d_model": m.mup.base_d_model if m.mup.enabled else 0,
        "mup_base_n_layers": m.mup.base_n_layers if m.mup.enabled else 0,
        "config": f"{CONFIG_DIR}/{rung.run_id}.yaml",
    }


def _fmt(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def manifest_csv(rows: list[dict[str, object]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=MANIFEST_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(v) for k, v in row.items()})
    return buf.getvalue()


def read_manifest(ladder_dir: str | Path) -> list[dict[str, str]]:
    path = Path(ladder_dir) / MANIFEST_FILE
    if not path.is_file():
        raise DelphiError(f"{ladder_dir}: no {MANIFEST_FILE}; plan a ladder there with `delphi ladder plan SPEC --out DIR`")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_ladder(spec: LadderSpec, rungs: list[Rung], out: str | Path) -> list[dict[str, object]]:
    """Write configs/<run_id>.yaml, manifest.csv and ladder.yaml into `out`.

    Re-planning into a directory that already holds the same ladder is a no-op;
    a different ladder there is an error (its runs would be orphaned).
    """
    out = Path(out)
    rows = [manifest_row(r) for r in rungs]
    text = manifest_csv(rows)
    existing = out / MANIFEST_FILE
    if existing.is_file() and existing.read_text() != text:
        raise DelphiError(f"--out: {out} already holds a different ladder (manifest.csv differs); choose a new directory")
    if out.exists() and not out.is_dir():
        raise DelphiError(f"--out: {out} exists and is not a directory")
    for rung in rungs:
        atomic_write_yaml(out / CONFIG_DIR / f"{rung.run_id}.yaml", train_config_to_dict(rung.train))
    atomic_write_yaml(out / SPEC_FILE, ladder_spec_to_dict(spec))
    atomic_write_text(existing, text)  # last: its presence marks a complete plan
    return rows


def format_table(rows: list[dict[str, object]]) -> str:
    head = f"{'run_id':<28} {'budget':>7} {'d':>4} {'L':>2} {'H':>2} {'N':>9} {'tokens':>10} {'D/N':>6} {'steps':>5} {'batch':>5} {'lr':>8} {'beta2':>6} {'dFLOPs':>7}"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['run_id']:<28} {r['budget']:>7.1e} {r['d_model']:>4} {r['n_layers']:>2} {r['n_heads']:>2} "
            f"{r['params']:>9,} {r['tokens']:>10,} {r['tokens_per_param']:>6.0f} {r['steps']:>5} {r['batch_size']:>5} "
            f"{r['lr']:>8.2e} {r['beta2']:>6.4f} {r['flops_error']:>+7.2%}"
        )
    return "\n".join(lines)
