"""The ladder directory on disk (docs/design.md §3.2): ladder.yaml (the spec), configs/ (one train
config per rung), manifest.csv (one row per rung) and runs/; written by `write_ladder` from the
planned rungs (delphi.ladder.plan), read back by the runner, the collector and the gates.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError, quoted
from delphi.io import atomic_write_text, atomic_write_yaml, read_text
from delphi.ladder.plan import Rung
from delphi.ladder.spec import LadderSpec, ladder_spec_to_dict
from delphi.model.flops import count_params
from delphi.train.config import train_config_to_dict

MANIFEST_FILE = "manifest.csv"
SPEC_FILE = "ladder.yaml"
CONFIG_DIR = "configs"
RUNS_DIR = "runs"


MANIFEST_COLUMNS = (
    "run_id",
    "budget",
    "seed",
    "flops",
    "flops_error",
    "flops_6nd",
    "params",
    "params_active",
    "params_total",
    "params_nonembedding",
    "tokens",
    "tokens_per_param",
    "steps",
    "batch_size",
    "batch_tokens",
    "seq_len",
    "d_model",
    "n_layers",
    "n_heads",
    "d_head",
    "d_ff",
    "experts",
    "top_k",
    "d_expert",
    "granularity",
    "shared_experts",
    "flops_per_token",
    "lr",
    "lr_batch_factor",
    "lr_horizon_factor",
    "lr_width_factor",
    "beta1",
    "beta2",
    "eps",
    "weight_decay",
    "grad_clip",
    "schedule",
    "warmup_frac",
    "decay_frac",
    "mup_base_d_model",
    "mup_base_n_layers",
    "config",
)
# Appended to a recipe ladder's manifest only (an old ladder's manifest stays byte-identical).
RECIPE_MANIFEST_COLUMNS = ("optimizer", "adam_lr", "batch_halvings", "recipe_caps")


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
        **(
            {}
            if rung.hp.recipe is None
            else {
                "optimizer": rung.hp.recipe.optimizer,
                "adam_lr": rung.hp.recipe.adam_lr,
                "batch_halvings": rung.hp.recipe.halvings,
                "recipe_caps": "+".join(rung.hp.recipe.caps),
            }
        ),
    }


def _fmt(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def manifest_csv(rows: list[dict[str, object]]) -> str:
    buf = io.StringIO()
    recipe = any("adam_lr" in row for row in rows)
    writer = csv.DictWriter(
        buf, fieldnames=MANIFEST_COLUMNS + (RECIPE_MANIFEST_COLUMNS if recipe else ()), lineterminator="\n"
    )
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(v) for k, v in row.items()})
    return buf.getvalue()


def ladder_own_paths(ladder_dir: str | Path) -> tuple[Path, ...]:
    """What `ladder plan` and `ladder run` write and read back: an --out must never land there."""
    return tuple(Path(ladder_dir) / name for name in (MANIFEST_FILE, SPEC_FILE, CONFIG_DIR, RUNS_DIR))


def read_manifest(ladder_dir: str | Path) -> list[dict[str, str]]:
    path = Path(ladder_dir) / MANIFEST_FILE
    if not path.is_file():
        raise DelphiError(
            f"{ladder_dir}: no {MANIFEST_FILE}; plan a ladder there with `delphi ladder plan SPEC --out DIR`"
        )

    reader = csv.DictReader(io.StringIO(read_text(path, what="manifest"), newline=""))
    rows = []
    try:
        for row in reader:
            rows.append(row)
            _check_manifest_row(row, path, reader.line_num, ladder_dir)
    except csv.Error as e:
        raise DelphiError(f"{path}: line {reader.line_num}: not valid CSV ({e}); {_replan(ladder_dir)}") from None
    missing = [c for c in ("run_id", "config", "flops") if rows and c not in rows[0]] if rows else []
    if not rows or missing:
        raise DelphiError(
            f"{path}: not a ladder manifest (no rows, or no column {quoted(missing[0] if missing else 'run_id')}); "
            f"{_replan(ladder_dir)}"
        )
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row["run_id"] in seen:
            raise DelphiError(
                f"{path}: run_id {quoted(row['run_id'])} is listed twice (rows {seen[row['run_id']] + 1} "
                f"and {i + 1}); {_replan(ladder_dir)}"
            )
        seen[row["run_id"]] = i
    return rows


# Manifest columns read as numbers (by `ladder run` and `ladder collect`), where present.
MANIFEST_NUMBER_COLUMNS = ("flops", "budget", "seed", "params", "tokens", "experts", "granularity")


def _replan(ladder_dir: str | Path) -> str:
    return f"restore it or re-plan with `delphi ladder plan SPEC --out {ladder_dir}`"


def _check_manifest_row(row: dict[str | None, Any], path: Path, line: int, ladder_dir: str | Path) -> None:
    """A row cut short (a truncated file), with cells beyond the header, or with a required cell
    empty or not a number, is a DelphiError naming the line and the column."""
    if None in row:
        raise DelphiError(
            f"{path}: line {line}: more cells than the header's {len(row) - 1} columns; {_replan(ladder_dir)}"
        )
    short = [k for k, v in row.items() if v is None]
    if short:
        raise DelphiError(
            f"{path}: line {line}: the row ends before column {quoted(short[0])} (a truncated file?); "
            f"{_replan(ladder_dir)}"
        )
    for column in ("run_id", "config", "flops"):
        if column in row and not row[column].strip():
            raise DelphiError(f"{path}: line {line}: {column} is empty; {_replan(ladder_dir)}")
    for column in MANIFEST_NUMBER_COLUMNS:
        text = row.get(column)
        if text is None or (text == "" and column != "flops"):
            continue
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise DelphiError(
                f"{path}: line {line}: {column} = {quoted(text)}, expected a number >= 0; {_replan(ladder_dir)}"
            )


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
        raise DelphiError(
            f"--out: {out} already holds a different ladder (manifest.csv differs); choose a new directory"
        )
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
