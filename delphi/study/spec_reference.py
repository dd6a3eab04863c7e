"""docs/spec-reference.md: every key of a ladder spec and a study file, generated from the schema.

    python -m delphi.study.spec_reference --write    # regenerate the page
    python -m delphi.study.spec_reference --check    # exit 1 when the page differs from the schema

The keys, their types and defaults are the dataclasses' (`delphi.ladder.spec.LadderSpec`,
`delphi.study.spec.StudySpec` and the sections they hold); a key's large-scale default is
`delphi.ladder.spec.LARGE_SCALE_DEFAULTS`'; its meaning is the comment written at the field (the
comment lines right above it and the one after it on its line), or MEANINGS for a field without one;
its unit is UNITS' (numbers only). tests/test_spec_reference.py fails when the page and the schema
differ, and when a key has no meaning or a number no unit.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any

from delphi.config_schema import to_dict
from delphi.io import atomic_write_text
from delphi.ladder.recipe import RecipeConstant
from delphi.ladder.spec import LARGE_SCALE_DEFAULTS, LARGE_SCALE_MIN_BUDGET, LadderSpec
from delphi.study.spec import StudySpec

PAGE = Path(__file__).resolve().parents[2] / "docs" / "spec-reference.md"
COMMAND = "python -m delphi.study.spec_reference --write"

# Units of the numeric keys ("1": a plain ratio or count of nothing in particular).
UNITS: dict[str, str] = {
    # ladder spec
    "budgets": "FLOPs",
    "seq_len": "tokens",
    "vocab_size": "tokens",
    "tolerance": "fraction",
    "base.d_model": "width",
    "base.n_layers": "layers",
    "base.lr": "LR",
    "base.batch_tokens": "tokens per step",
    "base.tokens": "tokens",
    "base.weight_decay": "1",
    "base.beta1": "1",
    "base.beta2": "1",
    "base.eps": "1",
    "base.grad_clip": "gradient norm",
    "base.init_std": "std",
    "base.alpha_in": "1",
    "base.alpha_out": "1",
    "shape.widths": "width (d_model)",
    "shape.depth.ratio": "width per layer",
    "shape.depth.min_layers": "layers",
    "shape.depth.max_layers": "layers",
    "shape.head_dim": "width",
    "shape.n_heads": "heads",
    "shape.ffn_mult": "x d_model",
    "shape.ffn_multiple": "width",
    "shape.hero_width_multiple": "width",
    "shape.moe.experts": "experts",
    "shape.moe.top_k": "experts",
    "shape.moe.granularity": "d_ff / d_expert",
    "shape.moe.shared_experts": "experts",
    "shape.moe.bias_update_rate": "per step",
    "shape.moe.aux_loss_weight": "x loss",
    "shape.moe.z_loss_weight": "x loss",
    "shape.moe.capacity_factor": "x even share",
    "isoflop.sizes": "rungs per budget",
    "isoflop.span": "x in N",
    "isoflop.min_span": "x in N",
    "isoflop.center_coefficient": "parameters",
    "isoflop.center_exponent": "1",
    "isoflop.center_at": "[FLOPs, parameters]",
    "isoflop.center_tokens_per_param": "tokens per parameter",
    "tokens_per_param.ratio": "tokens per parameter",
    "tokens_per_param.max_ratio_error": "fraction",
    "batch.min_steps": "steps",
    "batch.max_steps": "steps",
    "batch.min_seqs": "sequences",
    "batch.max_seqs": "sequences",
    "transfer.batch_exponent": "1",
    "transfer.horizon_exponent": "1",
    "transfer.width_exponent": "1",
    "transfer.lr_max": "LR",
    "transfer.beta2.anchor": "1",
    "transfer.beta2.ref_batch_tokens": "tokens per step",
    "transfer.beta2.min": "1",
    "transfer.beta2.max": "1",
    "transfer.warmup_frac": "fraction of steps",
    "transfer.decay_frac": "fraction of steps",
    "transfer.min_lr_frac": "fraction of the peak LR",
    "run.seeds": "seeds",
    "run.top_seeds": "seeds",
    "run.max_epochs": "epochs",
    "run.eval_tokens": "tokens",
    "run.final_eval_tokens": "tokens",
    "run.evals_per_run": "evaluations",
    "run.logs_per_run": "log lines",
    "run.checkpoints_per_run": "checkpoints",
    "run.keep_checkpoints": "checkpoints",
    "health.max_drop_frac": "fraction",
    "health.min_layers": "layers",
    "health.min_d_model": "width",
    "health.min_evals": "evaluations",
    "health.min_eval_tokens": "tokens",
    "anchors.widths": "width (d_model)",
    "anchors.multiple": "x top budget",
    "anchors.seeds": "seeds",
    "recipe.target_steps": "steps",
    "recipe.min_seqs": "sequences",
    "recipe.max_seqs": "sequences",
    "recipe.ref_batch_tokens": "tokens per step",
    "recipe.ref_tokens": "tokens",
    "recipe.lr": "LR",
    "recipe.batch_exponent": "1",
    "recipe.horizon_exponent": "1",
    "recipe.width_exponent": "1",
    "recipe.ref_d_model": "width",
    "recipe.lr_max": "LR",
    "recipe.adam_lr": "LR",
    "recipe.adam_lr_max": "LR",
    "recipe.eps": "1",
    "recipe.beta1": "1",
    "recipe.beta2": "1",
    "recipe.beta2_min": "1",
    "recipe.beta2_max": "1",
    "recipe.grad_clip": "gradient norm",
    "recipe.weight_decay": "1",
    "recipe.warmup_frac": "fraction of steps",
    "recipe.decay_frac": "fraction of steps",
    "recipe.min_lr_frac": "fraction of the peak LR",
    "recipe.check.hero_computes": "FLOPs",
    "recipe.check.widths": "width (d_model)",
    "recipe.check.width_tokens": "tokens",
    "recipe.check.horizons": "tokens",
    "recipe.check.horizon_width": "width (d_model)",
    "recipe.check.lr_multipliers": "x the recipe's LR",
    "recipe.check.seeds": "seeds",
    "recipe.check.batch_multipliers": "x the recipe's batch",
    "bounds.tokens_per_param": "tokens per parameter",
    "bounds.min_tokens_per_param": "tokens per parameter",
    # study file
    "bootstrap": "refits",
    "seed": "seed",
    "workers": "processes",
    "hero.compute": "FLOPs",
    "hero.compute_multiple": "x top budget",
    "hero.tolerance": "fraction of the loss",
    "hero.eval_every": "steps",
    "hero.rehearsal_multiple": "x top budget",
    "hero.checkpoint_every_s": "seconds",
    "hero.probe_multiples": "x top budget",
    "hero.seeds": "seeds",
    "hero.point_correction.rel": "fraction of the loss",
    "hero.point_correction.sd_rel": "fraction of the loss",
    "gates.backtest_tolerance": "fraction of the loss",
    "gates.lobo_tolerance": "fraction of the loss",
    "gates.rehearsal_tolerance": "fraction of the loss",
    "gates.agreement_tolerance": "fraction of the loss",
    "gates.interval_width_factor": "x tolerance",
    "gates.min_seeds": "seeds",
}

# Meanings of fields that carry no comment at their definition.
MEANINGS: dict[str, str] = {
    "name": "the study's name (reports, the preregistration's id)",
    "fits": "the laws the fit stage fits (delphi fit METHOD)",
    "bootstrap": "bootstrap refits behind every interval (0: none)",
    "hero": "the hero: its compute, tolerance, probes and how its prediction is sealed",
    "author": "the preregistration's author (null: the git user)",
    "rationale": "free text sealed with the preregistration",
    "gates": "the thresholds of the gates before the seal (docs/cli.md, Gates before sealing)",
    "hero.compute_multiple": "the hero's compute as a multiple of the top ladder budget, when hero.compute is null",
    "gates.backtest_tolerance": "gate backtest's tolerance (null: hero.tolerance)",
    "gates.lobo_tolerance": "gate lobo_spread's tolerance (null: hero.tolerance)",
    "gates.rehearsal_tolerance": "gate dress_rehearsal's tolerance (null: hero.tolerance)",
}


@dataclasses.dataclass(frozen=True)
class Key:
    key: str  # dotted, from the top of the file
    type: str
    default: str
    large: str  # the large-scale default ("" when the key has none)
    unit: str
    meaning: str
    section: str  # the dotted section it sits in ("" at the top)


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class source: the comment lines right above it and the comment
    after it on its line, joined."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    out = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above, line = [], stmt.lineno - 1
        while line in comments and line not in code_lines:
            above.insert(0, comments[line])
            line -= 1
        after = [comments[n] for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1) if n in comments]
        out[stmt.target.id] = " ".join(part for part in above + after if part)
    return out


def _summary(cls: type) -> str:
    """The first paragraph of a class's own docstring ("" for a dataclass without one)."""
    doc = cls.__doc__ or ""
    if not doc or doc.startswith(f"{cls.__name__}("):  # dataclasses write the signature where there is none
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def _is_dataclass_type(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _section_of(hint: Any) -> type | None:
    """The dataclass a field holds (itself, or inside `X | None`)."""
    if _is_dataclass_type(hint):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if _is_dataclass_type(a)]
        return inner[0] if len(inner) == 1 else None
    return None


def type_text(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is RecipeConstant:
        return "{value: number, source: string}"
    if _is_dataclass_type(hint):
        return "section"
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (tuple, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {type_text(args[0])}"
        return "[" + ", ".join(type_text(a) for a in args) + "]"
    if origin is dict:
        return f"mapping of {type_text(args[0])} to {type_text(args[1])}"
    return {int: "integer", float: "number", str: "string", bool: "true or false"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def value_text(value: Any) -> str:
    value = to_dict(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if float(f"{value:g}") == value else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {value_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return value if value else '""'
    return str(value)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def schema_keys(cls: type, prefix: str = "", large: dict[str, Any] | None = None) -> list[Key]:
    """Every key of the dataclass tree under `cls`, depth first, in field order."""
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    keys: list[Key] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        hint = hints[f.name]
        section = _section_of(hint)
        default = _default(f)
        if section is not None and section is not RecipeConstant:
            shown = (
                "required"
                if default is dataclasses.MISSING
                else ("null (no section)" if default is None else "the section's defaults")
            )
        else:
            shown = "required" if default is dataclasses.MISSING else value_text(default)
        meaning = comments.get(f.name) or MEANINGS.get(key, "") or (_summary(section) if section is not None else "")
        unit = UNITS.get(key, "")
        keys.append(
            Key(
                key,
                type_text(hint),
                shown,
                value_text(large[key].value) if large and key in large else "",
                unit,
                meaning,
                prefix.rstrip("."),
            )
        )
        if section is not None and section is not RecipeConstant:
            keys += schema_keys(section, f"{key}.", large)
    return keys


def ladder_keys() -> list[Key]:
    return schema_keys(LadderSpec, "", LARGE_SCALE_DEFAULTS)


def study_keys() -> list[Key]:
    return schema_keys(StudySpec)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(keys: list[Key], large: bool) -> list[str]:
    head = "| key | type | default | " + ("large-scale default | " if large else "") + "unit | meaning |"
    lines = [head, "|" + "---|" * (6 if large else 5)]
    for k in keys:
        cells = [f"`{k.key}`", k.type, f"`{k.default}`" if k.default else ""]
        if large:
            cells.append(f"`{k.large}`" if k.large else "")
        cells += [k.unit, k.meaning]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _sections(keys: list[Key]) -> list[tuple[str, list[Key]]]:
    """Keys grouped by their top-level section (the top level first)."""
    order: dict[str, list[Key]] = {}
    for k in keys:
        top = k.key.split(".")[0] if "." in k.key else ""
        order.setdefault(top, []).append(k)
    return list(order.items())


def render() -> str:
    out = [
        f"<!-- generated by `{COMMAND}` from the schema; edit the dataclasses' comments, not this page -->",
        "# Spec reference",
        "",
        "Every key of a ladder spec (`delphi ladder plan SPEC.yaml`) and of a study file (`delphi study "
        "STUDY.yaml`), generated from the dataclasses that read them (`delphi/ladder/spec.py`, "
        "`delphi/ladder/recipe.py`, `delphi/study/spec.py`). A key not listed here is refused (exit 2, naming "
        "it and the keys allowed there). Nested keys are written as YAML mappings: `shape.depth.rule: marin` "
        "is `shape: {depth: {rule: marin}}`. `delphi ladder plan` warns about a key that the spec's other "
        "choices leave unused, and says which defaults bind.",
        "",
        "## Ladder spec",
        "",
        "**Defaults at scale.** The `default` column holds Delphi's byte-level CPU defaults, tuned at "
        f"1e11-3e13 FLOPs. A spec whose top budget is at least {LARGE_SCALE_MIN_BUDGET:g} FLOPs (or that says "
        "`defaults: large`) takes the `large-scale default` instead for every key it leaves unset; the keys "
        "it sets are never changed. `delphi ladder plan` prints each large-scale default it took, and "
        "`--json` gives each one's source (`defaults.taken`).",
        "",
    ]
    for top, keys in _sections(ladder_keys()):
        out += [f"### {f'`{top}`' if top else 'Top level'}", "", *_table(keys, large=True), ""]
    out += [
        "## Study file",
        "",
        "A study file names its ladder spec (`ladder`, relative to the study file) and what happens after "
        "the ladder: the fits, the hero, the gates and the seal.",
        "",
    ]
    for top, keys in _sections(study_keys()):
        out += [f"### {f'`{top}`' if top else 'Top level'}", "", *_table(keys, large=False), ""]
    return "\n".join(out).rstrip() + "\n"


def problems() -> list[str]:
    """Keys without a meaning, numeric keys without a unit, and UNITS or MEANINGS entries naming no key."""
    keys = ladder_keys() + study_keys()
    names = {k.key for k in keys}
    numeric = ("integer", "number")
    out = [f"{k.key}: no meaning (a comment at the field, or MEANINGS)" for k in keys if not k.meaning]
    out += [
        f"{k.key}: no unit (UNITS)"
        for k in keys
        if not k.unit and any(t in k.type for t in numeric) and k.type != "section"
    ]
    out += [f"UNITS[{key!r}]: no such key" for key in UNITS if key not in names]
    out += [f"MEANINGS[{key!r}]: no such key" for key in MEANINGS if key not in names]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m delphi.study.spec_reference", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"regenerate {PAGE.name}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the page differs from the schema")
    args = parser.parse_args(argv)
    issues = problems()
    for line in issues:
        print(f"spec_reference: {line}", file=sys.stderr)
    text = render()
    if args.write:
        atomic_write_text(PAGE, text)
        print(f"wrote {PAGE}", file=sys.stderr)
        return 1 if issues else 0
    same = PAGE.is_file() and PAGE.read_text() == text
    if not same:
        print(f"{PAGE} differs from the schema; regenerate it with `{COMMAND}`", file=sys.stderr)
    return 0 if same and not issues else 1


if __name__ == "__main__":
    sys.exit(main())
