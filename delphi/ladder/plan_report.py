"""What `delphi ladder plan` says about a plan before it writes it:

    plan_health_warnings(spec, rungs) -> the health bounds (spec.health) planned rungs already miss
    scale_default_notes(raw)          -> the keys that took a large-scale default, with their sources
    binding_cap_notes(spec, raw, rungs) -> each default cap or floor that changed a rung
    head_size_notes(spec, rungs)      -> widths whose head size is not shape.head_dim
    tokens_per_param_warnings(spec, rungs) -> rungs outside bounds.tokens_per_param
    unused_key_warnings(raw)          -> keys the spec sets that its other choices leave unused

`raw` is the spec file's own mapping (before any default is filled in): a key it leaves out is a
default. Each function returns one line per finding, for stderr and for `--json`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from delphi.ladder.plan import Rung, rule_layers, rung_role, shape_for_width
from delphi.ladder.spec import LadderSpec, defaults_scale, has_key, large_scale_fills
from delphi.train.config import TrainConfig

SHOWN = 3  # rungs named per line; the count says how many more


def _some(rungs: list[Rung], value: Callable[[Rung], str]) -> str:
    shown = ", ".join(f"{r.run_id} ({value(r)})" for r in rungs[:SHOWN])
    return shown + (f", ... ({len(rungs) - SHOWN} more)" if len(rungs) > SHOWN else "")


def _origin(raw: dict, key: str) -> str | None:
    """ "the default" or "the large-scale default" for a key the spec leaves unset; None when it sets it."""
    if has_key(raw, key):
        return None
    return "the large-scale default" if key in large_scale_fills(raw) else "the default"


def scale_default_notes(raw: dict) -> list[str]:
    """One line naming every key that took a large-scale default (their sources are in --json)."""
    fills = large_scale_fills(raw)
    if not fills:
        return []
    why = "defaults: large" if raw.get("defaults") == "large" else "its top budget is >= 1e15 FLOPs (defaults: auto)"
    values = ", ".join(f"{key}={_short(d.value)}" for key, d in fills.items())
    return [
        f"large-scale defaults ({why}; `defaults: cpu` keeps the CPU ones) for the keys the spec leaves unset: {values}"
    ]


def scale_defaults_json(raw: dict) -> dict[str, Any]:
    return {
        "scale": defaults_scale(raw),
        "taken": {key: {"value": d.value, "source": d.source} for key, d in large_scale_fills(raw).items()},
    }


def _short(value: Any) -> str:
    if isinstance(value, list) and len(value) > 4:
        return f"[{value[0]}, {value[1]}, ..., {value[-1]}] ({len(value)} values)"
    return "null" if value is None else str(value)


def binding_cap_notes(spec: LadderSpec, raw: dict, rungs: list[Rung]) -> list[str]:
    """Each cap or floor the spec leaves at a default that changed at least one rung: the depth
    rule's min_layers / max_layers, the batch rule's min_seqs / max_seqs, transfer.lr_max and the
    beta2 clip. A recipe's own caps are in its manifest column recipe_caps."""
    notes = []
    depth = spec.shape.depth

    def note(key: str, value: Any, hit: list[Rung], what: Callable[[Rung], str], verb: str) -> None:
        origin = _origin(raw, key)
        if hit and origin is not None:
            notes.append(f"{key}={value} ({origin}) {verb} {len(hit)} of {len(rungs)} rungs: {_some(hit, what)}")

    rule = lambda r: f"{r.model.n_layers} layers, the rule gives {rule_layers(spec, r.model.d_model)}"  # noqa: E731
    note(
        "shape.depth.max_layers",
        depth.max_layers,
        [r for r in rungs if depth.max_layers is not None and rule_layers(spec, r.model.d_model) > depth.max_layers],
        rule,
        "caps",
    )
    note(
        "shape.depth.min_layers",
        depth.min_layers,
        [r for r in rungs if rule_layers(spec, r.model.d_model) < depth.min_layers],
        rule,
        "raises",
    )
    if spec.recipe is not None:
        return notes
    b, t = spec.batch, spec.transfer
    seqs = lambda r: f"{r.batch_size} sequences, {r.steps:,} steps"  # noqa: E731
    # the batch rule's power of two before the clip: the rung's own, or its budget's fewest-token rung's
    raw_batch = {r.run_id: _rule_batch(spec, r, rungs) for r in rungs}
    note(
        "batch.max_seqs", b.max_seqs, [r for r in rungs if raw_batch[r.run_id] > b.max_seqs], seqs, "caps the batch of"
    )
    note(
        "batch.min_seqs",
        b.min_seqs,
        [r for r in rungs if raw_batch[r.run_id] < b.min_seqs],
        seqs,
        "raises the batch of",
    )
    lr = lambda r: f"lr {r.hp.lr:.3g}, the rule gives {_rule_lr(spec, r):.3g}"  # noqa: E731
    note(
        "transfer.lr_max",
        t.lr_max,
        [r for r in rungs if _rule_lr(spec, r) > t.lr_max * (1 + 1e-12)],
        lr,
        "caps the LR of",
    )
    if t.beta2.rule == "batch_power":
        beta2 = lambda r: f"beta2 {r.hp.beta2:.4g}, the rule gives {_rule_beta2(spec, r):.4g}"  # noqa: E731
        note(
            "transfer.beta2.max",
            t.beta2.max,
            [r for r in rungs if _rule_beta2(spec, r) > t.beta2.max],
            beta2,
            "caps beta2 of",
        )
        note(
            "transfer.beta2.min",
            t.beta2.min,
            [r for r in rungs if _rule_beta2(spec, r) < t.beta2.min],
            beta2,
            "raises beta2 of",
        )
    return notes


def _family_index(spec: LadderSpec, rung: Rung) -> int:
    """Which of `spec.variants()` planned the rung (0 unless the spec sweeps experts or granularity)."""
    for i, variant in enumerate(spec.variants()):
        if variant.shape.moe is None or shape_for_width(variant, rung.model.d_model).moe == rung.model.moe:
            return i
    return 0


def _rule_batch(spec: LadderSpec, rung: Rung, rungs: list[Rung]) -> float:
    """The batch rule's power of two of sequences before batch.min_seqs / max_seqs clip it: from the
    rung's own tokens, or (rule budget) its budget's fewest-token isoFLOP rung of its family's. An
    anchor takes the top budget's batch, so it is never clipped itself."""
    if rung_role(rung.run_id) != "isoflop":
        return float(rung.batch_size)
    tokens = rung.budget / rung.flops_per_token  # as the batch rule reads it (delphi.ladder.plan.rung_tokens)
    if spec.batch.rule == "budget":
        family = _family_index(spec, rung)
        tokens = min(
            r.budget / r.flops_per_token
            for r in rungs
            if r.budget == rung.budget and rung_role(r.run_id) == "isoflop" and _family_index(spec, r) == family
        )
    per_step = tokens / (spec.batch.min_steps * spec.seq_len)
    return 2.0 ** math.floor(math.log2(per_step)) if per_step >= 1 else per_step


def _rule_lr(spec: LadderSpec, rung: Rung) -> float:
    hp = rung.hp
    return spec.base.lr * hp.lr_batch_factor * hp.lr_horizon_factor * hp.lr_width_factor


def _rule_beta2(spec: LadderSpec, rung: Rung) -> float:
    b2 = spec.transfer.beta2
    anchor = b2.anchor if b2.anchor is not None else spec.base.beta2
    ref = b2.ref_batch_tokens if b2.ref_batch_tokens is not None else spec.base.batch_tokens
    return anchor ** (rung.batch_size * spec.seq_len / ref)


def head_size_notes(spec: LadderSpec, rungs: list[Rung]) -> list[str]:
    """Widths whose heads are not of size shape.head_dim (heads ~ d / head_dim, adjusted to divide d)."""
    if spec.shape.n_heads is not None:
        return []
    odd = sorted(
        {(r.model.d_model, r.model.n_heads, r.model.d_head) for r in rungs if r.model.d_head != spec.shape.head_dim}
    )
    if not odd:
        return []
    shown = ", ".join(f"d_model={d}: {h} heads of {dh}" for d, h, dh in odd[:6]) + (", ..." if len(odd) > 6 else "")
    return [
        f"shape.head_dim={spec.shape.head_dim}: {len(odd)} widths do not split into heads of that size and get the "
        f"nearest head count that divides them into even heads: {shown}"
    ]


def tokens_per_param_warnings(spec: LadderSpec, rungs: list[Rung]) -> list[str]:
    """One line naming the rungs outside bounds.tokens_per_param (none when the spec states no range).
    Anchor rungs are left out: they train far past their optimum on purpose (`anchors:`)."""
    bounds = spec.bounds.tokens_per_param
    if bounds is None:
        return []
    low, high = bounds
    outside = [r for r in rungs if rung_role(r.run_id) == "isoflop" and not low <= r.tokens / r.params <= high]
    if not outside:
        return []
    return [
        f"bounds.tokens_per_param=[{low:g}, {high:g}]: {len(outside)} of {len(rungs)} rungs train outside it: "
        + _some(outside, lambda r: f"{r.tokens / r.params:.3g} tokens per parameter")
    ]


# (key the spec sets, when it is unused, why) for keys that another choice of the spec leaves unused.
UNUSED_WHEN: tuple[tuple[str, Callable[[dict], bool], str], ...] = (
    ("shape.head_dim", lambda s: s["shape"].get("n_heads") is not None, "shape.n_heads fixes the head count"),
    ("shape.depth.ratio", lambda s: s["shape"]["depth"].get("rule") == "marin", "shape.depth.rule is marin"),
    (
        "shape.moe.bias_update_rate",
        lambda s: s["shape"]["moe"].get("balance", "bias") != "bias",
        "shape.moe.balance is not bias",
    ),
    (
        "shape.moe.aux_loss_weight",
        lambda s: s["shape"]["moe"].get("balance", "bias") != "aux",
        "shape.moe.balance is not aux",
    ),
    (
        "isoflop.center_coefficient",
        lambda s: s["isoflop"].get("center_tokens_per_param") is not None,
        "isoflop.center_tokens_per_param sets the expected optimum",
    ),
    (
        "isoflop.center_exponent",
        lambda s: s["isoflop"].get("center_tokens_per_param") is not None,
        "isoflop.center_tokens_per_param sets the expected optimum",
    ),
    (
        "transfer.beta2.anchor",
        lambda s: s["transfer"]["beta2"].get("rule", "constant") == "constant",
        "transfer.beta2.rule is constant",
    ),
    (
        "transfer.beta2.ref_batch_tokens",
        lambda s: s["transfer"]["beta2"].get("rule", "constant") == "constant",
        "transfer.beta2.rule is constant",
    ),
    (
        "transfer.beta2.min",
        lambda s: s["transfer"]["beta2"].get("rule", "constant") == "constant",
        "transfer.beta2.rule is constant",
    ),
    (
        "transfer.beta2.max",
        lambda s: s["transfer"]["beta2"].get("rule", "constant") == "constant",
        "transfer.beta2.rule is constant",
    ),
    ("transfer.decay_frac", lambda s: s["transfer"].get("schedule", "wsd") != "wsd", "transfer.schedule is not wsd"),
    ("transfer.decay_shape", lambda s: s["transfer"].get("schedule", "wsd") != "wsd", "transfer.schedule is not wsd"),
    ("isoflop", lambda s: s.get("mode", "isoflop") != "isoflop", "mode is tokens_per_param"),
    ("tokens_per_param", lambda s: s.get("mode", "isoflop") != "tokens_per_param", "mode is isoflop"),
)


def unused_key_warnings(raw: dict) -> list[str]:
    """One line per key the spec file sets that its other choices leave unused (set but inert)."""
    out = []
    for key, unused, why in UNUSED_WHEN:
        if not has_key(raw, key) or raw_value(raw, key) is None:
            continue
        try:
            inert = unused(raw)
        except (KeyError, AttributeError, TypeError):  # a section the spec leaves out: nothing to compare
            continue
        if inert:
            out.append(f"{key} is set but unused: {why}")
    return out


def raw_value(raw: dict, key: str) -> Any:
    node: Any = raw
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def evals_of(train: TrainConfig) -> int:
    """Evaluations the trainer logs: every eval_every steps and at the last step."""
    return train.steps // train.eval_every + (1 if train.steps % train.eval_every else 0)


def plan_health_warnings(spec: LadderSpec, rungs: list[Rung]) -> list[str]:
    """The health bounds (spec.health) that planned rungs already miss: layers, width, evals, eval tokens.

    Drops are only known after training (`delphi ladder collect` reports them)."""
    h = spec.health
    checks = (
        ("min_layers", h.min_layers, lambda r: r.model.n_layers, "layers"),
        ("min_d_model", h.min_d_model, lambda r: r.model.d_model, "d_model"),
        ("min_evals", h.min_evals, lambda r: evals_of(r.train), "evals"),
        ("min_eval_tokens", h.min_eval_tokens, lambda r: r.train.last_eval_tokens, "final eval tokens"),
    )
    warnings = []
    for key, bound, value, what in checks:
        low = [r for r in rungs if value(r) < bound]
        if low:
            shown = ", ".join(f"{r.run_id} ({value(r):,})" for r in low[:3]) + (", ..." if len(low) > 3 else "")
            warnings.append(f"health.{key}={bound:,}: {len(low)} of {len(rungs)} rungs have fewer {what}: {shown}")
    return warnings
