"""Collecting a ladder's runs into the results table that `delphi fit` reads.

One row per rung of the manifest, with the canonical columns first (docs/design.md
§3.3): params (N, active non-embedding), tokens (D), flops (C, exact),
loss (final validation loss, nats per token: `loss_unit`, of the run's `tokenizer`),
budget, run_id, experts, granularity; then status, bpb (bits per byte of text), the 6ND
FLOPs, every parameter count, the shape and the transferred hyperparameters. By default only completed rungs are
written (a fit must not see a half-trained or diverged run); `include_all`
adds the others with an empty loss.

Seeds: one row per (rung, seed) run; the rows of one cell (budget x shape) share `cell_id` and
carry the cell's `loss_mean`, `loss_std` (ddof=1; NaN with one seed) and `n_seeds` (completed
seeds with a finite loss).

Health (spec `health:` bounds, docs/design.md §8.2 / issue 10): every row reports the mean share of routed
assignments dropped in training (`drop_frac_mean`, the mean of the `drop_frac` the trainer logs at
every log step of metrics.jsonl; 0 for a dense model), its steps, tokens per parameter, number of
evals and eval tokens, and `health_ok` / `health_issues` (";"-joined names of the bounds it misses).

`write_results` also writes `<results>.family.json` (the ladder's FLOPs family, `flops_family`)
beside the table, which `delphi fit` picks up for exact-FLOP allocation.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd

from delphi.errors import DelphiError
from delphi.fits.data import CANONICAL_COLUMNS
from delphi.io import atomic_write_json, atomic_write_text
from delphi.ladder.manifest import RUNS_DIR, SPEC_FILE, read_manifest
from delphi.ladder.plan import cell_id_of, flops_family, rung_role
from delphi.ladder.runner import rung_status
from delphi.ladder.spec import HealthSpec, LadderSpec, load_ladder_spec
from delphi.train.rundir import CONFIG_FILE, LOSS_UNIT, read_metrics, read_summary, summary_problem

EXTRA_COLUMNS = (
    "status",
    "bpb",
    "seed",
    "flops_6nd",
    "flops_planned",
    "params_active",
    "params_total",
    "params_nonembedding",
    "steps",
    "batch_size",
    "batch_tokens",
    "seq_len",
    "d_model",
    "n_layers",
    "n_heads",
    "d_head",
    "d_ff",
    "top_k",
    "d_expert",
    "shared_experts",
    "lr",
    "beta1",
    "beta2",
    "eps",
    "weight_decay",
    "grad_clip",
    "schedule",
    "warmup_frac",
    "decay_frac",
    "tokens_per_param",
    "wall_time_s",
    "data_sha256",
    "config_sha256",
)
CELL_COLUMNS = ("cell_id", "loss_mean", "loss_std", "n_seeds")
HEALTH_COLUMNS = ("drop_frac_mean", "n_evals", "eval_tokens", "health_ok", "health_issues", "health_relaxed")
# "anchor" for the spec's long rungs (anchors), "isoflop" for the rest (delphi.fits.data reads it)
ROLE_COLUMNS = ("role",)
# What the loss is measured in: `loss` (and loss_mean, loss_std) in nats per token of the run's
# tokenizer ("byte" or "bpe"), `bpb` in bits per byte of text; tables of different tokenizers
# compare on bpb (`delphi fit ... --loss-col bpb`). Runs from before the columns were byte runs.
UNIT_COLUMNS = ("loss_unit", "tokenizer")
RESULT_COLUMNS = CANONICAL_COLUMNS + EXTRA_COLUMNS + CELL_COLUMNS + HEALTH_COLUMNS + ROLE_COLUMNS + UNIT_COLUMNS
# The per-row view of rung health (the report's and the gates' table).
HEALTH_TABLE_COLUMNS = (
    "run_id",
    "cell_id",
    "budget",
    "seed",
    "d_model",
    "n_layers",
    "steps",
    "tokens_per_param",
    "n_evals",
    "eval_tokens",
    "drop_frac_mean",
    "health_ok",
    "health_issues",
    "health_relaxed",
)
FAMILY_SUFFIX = ".family.json"  # <results>.family.json beside the table (delphi.fits.data reads it)


def _number(text: str | None) -> object:
    """Manifest cells are text: give numbers back their type."""
    if text is None or text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def run_health(run_dir: Path, moe: bool) -> dict[str, object]:
    """drop_frac_mean and n_evals of one run from its metrics.jsonl."""
    records = read_metrics(run_dir)
    drops = [float(r["drop_frac"]) for r in records if r.get("drop_frac") is not None]
    n_evals = sum(1 for r in records if r.get("val_loss") is not None)
    if not moe:
        drop = 0.0  # a dense block routes nothing
    else:
        drop = sum(drops) / len(drops) if drops else float("nan")
    return {"drop_frac_mean": drop, "n_evals": n_evals}


def health_issues(row: dict | pd.Series, health: HealthSpec) -> list[str]:
    """Names of the `health:` bounds a results row misses (an unknown drop share counts as missed)."""
    issues = []
    drop = row["drop_frac_mean"]
    if drop is None or not math.isfinite(float(drop)) or float(drop) > health.max_drop_frac:
        issues.append("max_drop_frac")
    for key, column in (
        ("min_layers", "n_layers"),
        ("min_d_model", "d_model"),
        ("min_evals", "n_evals"),
        ("min_eval_tokens", "eval_tokens"),
    ):
        value = row[column]
        if value is None or (isinstance(value, float) and math.isnan(value)) or value < getattr(health, key):
            issues.append(key)
    return issues


def relaxed_bounds(health: HealthSpec) -> str:
    """The spec's bounds looser than issue 10's defaults (HealthSpec()), e.g. "min_d_model 12 < 24":
    a rung may be healthy by its own spec and still below the defaults; the gates and report say so."""
    default = HealthSpec()
    looser = []
    for key, value in vars(health).items():
        base = getattr(default, key)
        if (value > base) if key.startswith("max_") else (value < base):
            looser.append(f"{key} {value:g} {'>' if key.startswith('max_') else '<'} {base:g}")
    return ";".join(looser)


def relaxed_in_table(table: pd.DataFrame) -> list[str]:
    """The relaxed bounds a results table records (its health_relaxed column; none if absent)."""
    if "health_relaxed" not in table:
        return []
    return sorted({b for text in table["health_relaxed"] if isinstance(text, str) for b in text.split(";") if b})


def ladder_spec_of(ladder_dir: str | Path) -> LadderSpec | None:
    """The spec pinned in a ladder dir by `write_ladder` (None for a dir without one)."""
    path = Path(ladder_dir) / SPEC_FILE
    return load_ladder_spec(path) if path.is_file() else None


def _eval_tokens(run_dir: Path, default: int) -> int:
    """Validation tokens of the final evaluation in the run's resolved config (the spec's when the
    run has not started)."""
    from delphi.io import read_yaml

    try:
        cfg = read_yaml(run_dir / CONFIG_FILE)
        return int(cfg.get("final_eval_tokens") or cfg["eval_tokens"])
    except (OSError, KeyError, TypeError, ValueError, DelphiError):
        return default


def add_cell_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """cell_id, loss_mean, loss_std (ddof=1), n_seeds over each cell's rows with a finite loss."""
    frame = frame.copy()
    frame["cell_id"] = [cell_id_of(str(r)) for r in frame["run_id"]]
    loss = pd.to_numeric(frame["loss"], errors="coerce")
    groups = loss.groupby(frame["cell_id"])
    frame["loss_mean"] = groups.transform("mean")
    frame["loss_std"] = groups.transform(lambda x: x.std(ddof=1) if x.count() > 1 else float("nan"))
    frame["n_seeds"] = groups.transform("count").astype(int)
    return frame


def collect_ladder(ladder_dir: str | Path, *, include_all: bool = False) -> pd.DataFrame:
    ladder_dir = Path(ladder_dir)
    spec = ladder_spec_of(ladder_dir)
    health = spec.health if spec is not None else HealthSpec()
    default_eval_tokens = (spec.run.final_eval_tokens or spec.run.eval_tokens) if spec is not None else 0
    rows = []
    for m in read_manifest(ladder_dir):
        run_dir = ladder_dir / RUNS_DIR / m["run_id"]
        status = rung_status(run_dir)
        if status in ("completed", "diverged") and (problem := summary_problem(run_dir, status)):
            raise DelphiError(
                f"{problem}; the rung's result is lost: restore the file, or delete {run_dir} "
                "and run the ladder again to retrain it"
            )
        summary = read_summary(run_dir) if status in ("completed", "diverged") else {}
        loss = summary.get("val_loss")
        complete = status == "completed" and loss is not None and math.isfinite(float(loss))
        if not (complete or include_all):
            continue
        tokens = int(summary["tokens"]) if complete else int(float(m["tokens"]))
        params = int(m["params"])
        row = {
            "params": params,
            "tokens": tokens,
            "flops": float(summary["flops"]) if complete else float(m["flops"]),
            "loss": float(loss) if complete else None,
            "budget": float(m["budget"]),
            "run_id": m["run_id"],
            "experts": int(m["experts"]),
            "granularity": float(m["granularity"]),
            "status": status,
            "bpb": summary.get("val_bpb") if complete else None,
            "flops_6nd": 6.0 * params * tokens,
            "flops_planned": float(m["flops"]),
            "tokens_per_param": tokens / params,
            "wall_time_s": summary.get("wall_time_s"),
            "data_sha256": summary.get("data_sha256"),
            "config_sha256": summary.get("config_sha256"),
        }
        for key in EXTRA_COLUMNS:
            if key not in row:
                row[key] = _number(m.get(key))
        if complete and summary.get("steps") is not None:
            row["steps"] = int(summary["steps"])
        row.update(run_health(run_dir, moe=int(m["experts"]) > 0))
        row["eval_tokens"] = _eval_tokens(run_dir, default_eval_tokens)
        issues = health_issues(row, health)
        row["health_ok"] = not issues
        row["health_issues"] = ";".join(issues)
        row["health_relaxed"] = relaxed_bounds(health)
        row["role"] = rung_role(m["run_id"])
        row["loss_unit"] = summary.get("loss_unit", LOSS_UNIT)
        row["tokenizer"] = summary.get("tokenizer", "byte")
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[c for c in RESULT_COLUMNS if c not in CELL_COLUMNS])
    frame = add_cell_columns(frame)
    frame = frame[list(RESULT_COLUMNS)]
    if spec is not None:
        frame.attrs["ladder_spec_path"] = str(ladder_dir / SPEC_FILE)
    return frame


def rung_health_table(results: pd.DataFrame | str | Path) -> pd.DataFrame:
    """One row per run: the health columns of a results table (a DataFrame or a results CSV)."""
    frame = pd.read_csv(results) if isinstance(results, (str, Path)) else results
    if "health_relaxed" not in frame.columns:  # tables collected before the column existed
        frame = frame.assign(health_relaxed="")
    missing = [c for c in HEALTH_TABLE_COLUMNS if c not in frame.columns]
    if missing:
        where = results if isinstance(results, (str, Path)) else "results"
        raise DelphiError(
            f"{where}: no rung health columns ({', '.join(missing)}); collect the ladder again "
            "with `delphi ladder collect`"
        )
    table = frame[list(HEALTH_TABLE_COLUMNS)].copy()
    table["health_issues"] = table["health_issues"].fillna("").astype(str)
    table["health_relaxed"] = table["health_relaxed"].fillna("").astype(str)
    table["health_ok"] = table["health_ok"].astype(bool)
    return table.reset_index(drop=True)


def format_health_table(table: pd.DataFrame) -> str:
    """The health table as text (stderr of `delphi ladder collect`, the report)."""
    head = f"{'run_id':<30} {'steps':>6} {'D/N':>7} {'evals':>5} {'eval tok':>9} {'drops':>7}  health"
    lines = [head]
    for _, r in table.iterrows():
        lines.append(
            f"{r['run_id']:<30} {int(r['steps']):>6} {float(r['tokens_per_param']):>7.1f} {int(r['n_evals']):>5} "
            f"{int(r['eval_tokens']):>9,} {float(r['drop_frac_mean']):>7.2%}  {'ok' if r['health_ok'] else r['health_issues']}"
        )
    bad = int((~table["health_ok"]).sum())
    lines.append(f"rung health: {len(table) - bad} of {len(table)} rungs within the spec's health bounds")
    return "\n".join(lines)


def family_path(results: str | Path) -> Path:
    """Where the FLOPs family of a results table lives: <results>.family.json."""
    return Path(str(results) + FAMILY_SUFFIX)


def write_family(spec: LadderSpec, out: str | Path, source: str | None = None, written_by: str | None = None) -> dict:
    """Write the spec's FLOPs family (non-embedding N, the canonical `params`) as JSON; return it.
    `written_by`: the command, which the file then names (delphi.path_policy)."""
    import dataclasses

    family = flops_family(spec)
    if source is not None:
        family = dataclasses.replace(family, source=source)
    data = family.to_json()
    atomic_write_json(out, data, written_by=written_by)
    return data


def write_results(frame: pd.DataFrame, out: str | Path, written_by: str | None = None) -> None:
    """Write the table, and `<out>.family.json` when the table came from a ladder with a pinned spec.
    `written_by`: the command, which both files then name (the CSV in its `.delphi.json` sidecar)."""
    buf = io.StringIO()
    frame.to_csv(buf, index=False, float_format="%.10g")
    spec_path = frame.attrs.get("ladder_spec_path")
    spec = load_ladder_spec(spec_path) if spec_path else None
    # A ladder that sweeps experts or granularity holds several families: the fits read each row's shape.
    if spec is not None and len(spec.variants()) == 1:
        write_family(spec, family_path(out), source=f"ladder spec {spec_path}", written_by=written_by)
    atomic_write_text(out, buf.getvalue(), written_by=written_by)
