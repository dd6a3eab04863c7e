"""Results tables: load, map columns, derive what is missing, validate.

Every fit reads one table with the canonical columns of DESIGN.md section 3:
`params` (N, active non-embedding), `tokens` (D), `flops` (C), `loss`, and
optionally `budget`, `run_id`, `experts`, `granularity`. Tables named
otherwise (the public reference CSVs) are mapped by column name. When only
two of N, D, C are given the third follows from C = 6 N D (Kaplan et al. 2020).

Rows with NaN or infinite values in a needed column (unfinished or diverged
runs) and rows whose `status` is not "completed" are dropped and counted.
Non-positive values are an error by default: a negative loss or a zero
parameter count means a wrong column mapping, not a run to skip. Pass
`drop_invalid=True` to drop them with a count instead.

The table's metadata (input sha256, drop counts, whether budgets were derived)
travels in `DataFrame.attrs` so a fit can record its provenance.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from delphi.errors import DelphiError

# C = 6 N D: forward 2 FLOPs per parameter per token, backward 4 (Kaplan et al. 2020, sec. 2.1).
FLOPS_PER_PARAM_TOKEN = 6.0
# Budgets are derived from `flops` when a table has no budget column: sorted log10 C values
# further apart than this start a new budget. 0.05 decades = 12%; isoFLOP grids are spaced
# far wider (Chinchilla: 6e18, 1e19, 3e19 ... = at least 0.22 decades) while digitised or
# exact-FLOP values of one budget scatter by a few percent.
BUDGET_GAP_LOG10 = 0.05

CANONICAL = ("params", "tokens", "flops", "loss", "budget", "run_id", "experts", "granularity")
NUMERIC = ("params", "tokens", "flops", "loss", "budget", "experts", "granularity")


def load_results(
    source: str | os.PathLike | pd.DataFrame,
    *,
    params_col: str | None = None,
    tokens_col: str | None = None,
    flops_col: str | None = None,
    loss_col: str | None = None,
    budget_col: str | None = None,
    run_id_col: str | None = None,
    experts_col: str | None = None,
    granularity_col: str | None = None,
    query: str | None = None,
    drop_invalid: bool = False,
    derive_budgets: bool = True,
) -> pd.DataFrame:
    """Read a results table and return it with canonical column names.

    A `*_col` left as None means "the canonical name, if the table has it";
    a name given explicitly must exist. `query` is a pandas query applied first
    (e.g. `"experiment == 'llama_3__raw_loss' and not outlier"`).
    """
    where, raw, sha = _read(source)
    if query:
        try:
            raw = raw.query(query)
        except Exception as e:  # pandas raises many types for a bad expression
            raise DelphiError(f"{where}: query {query!r} failed ({type(e).__name__}: {e})") from None
    if raw.empty:
        raise DelphiError(f"{where}: no rows" + (f" after query {query!r}" if query else ""))

    mapping = {
        "params": params_col, "tokens": tokens_col, "flops": flops_col, "loss": loss_col,
        "budget": budget_col, "run_id": run_id_col, "experts": experts_col,
        "granularity": granularity_col,
    }
    table = pd.DataFrame(index=raw.index)
    for name, col in mapping.items():
        if col is not None:
            if col not in raw.columns:
                raise DelphiError(
                    f"{where}: column {col!r} (for {name}) not found; columns are {list(raw.columns)}"
                )
            table[name] = raw[col]
        elif name in raw.columns:
            table[name] = raw[name]
    for name in ("params", "loss"):
        if name not in table:
            raise DelphiError(
                f"{where}: no {name!r} column; map one with --{name}-col (columns are {list(raw.columns)})"
            )
    if "tokens" not in table and "flops" not in table:
        raise DelphiError(
            f"{where}: need a 'tokens' or a 'flops' column (map with --tokens-col/--flops-col); "
            f"columns are {list(raw.columns)}"
        )
    for name in NUMERIC:
        if name in table:
            table[name] = pd.to_numeric(table[name], errors="coerce").astype(float)
    if "run_id" in table:
        table["run_id"] = table["run_id"].astype(str)

    dropped: dict[str, int] = {}
    if "status" in raw.columns:
        done = raw["status"].astype(str) == "completed"
        if (~done).any():
            dropped["status_not_completed"] = int((~done).sum())
            table = table[done]

    # A dense ladder's table carries experts = 0 (or blank): that column describes no MoE, so it
    # is dropped rather than failing every row; only the MoE law needs it.
    for name in ("experts", "granularity"):
        if name in table and not (table[name] > 0).any():
            table = table.drop(columns=name)
    needed = [c for c in ("params", "tokens", "flops", "loss", "budget", "experts", "granularity") if c in table]
    finite = np.isfinite(table[needed].to_numpy(dtype=float)).all(axis=1)
    if (~finite).any():
        dropped["nan_or_inf"] = int((~finite).sum())
        table = table[finite]

    positive = (table[needed].to_numpy(dtype=float) > 0).all(axis=1)
    if (~positive).any():
        if not drop_invalid:
            row = int(np.flatnonzero(~positive)[0])
            bad = [c for c in needed if not table[c].iloc[row] > 0][0]
            raise DelphiError(
                f"{where}: row {table.index[row]}: {bad} = {float(table[bad].iloc[row])!r}, expected > 0 "
                f"({int((~positive).sum())} such rows; --drop-invalid drops them)"
            )
        dropped["non_positive"] = int((~positive).sum())
        table = table[positive]

    if table.empty:
        raise DelphiError(f"{where}: no usable rows left (dropped: {dropped})")

    if "tokens" not in table:
        table["tokens"] = table["flops"] / (FLOPS_PER_PARAM_TOKEN * table["params"])
    if "flops" not in table:
        table["flops"] = FLOPS_PER_PARAM_TOKEN * table["params"] * table["tokens"]
    budget_derived = False
    if "budget" not in table and derive_budgets:
        table["budget"] = derive_budget(table["flops"].to_numpy())
        budget_derived = True

    table = table[[c for c in CANONICAL if c in table]].reset_index(drop=True)
    table.attrs.update(
        {"source": where, "sha256": sha, "dropped": dropped, "budget_derived": budget_derived, "query": query}
    )
    return table


def _read(source: str | os.PathLike | pd.DataFrame) -> tuple[str, pd.DataFrame, str]:
    if isinstance(source, pd.DataFrame):
        sha = hashlib.sha256(source.to_csv(index=False).encode()).hexdigest()
        return "table", source.copy(), sha
    path = Path(source)
    if not path.is_file():
        raise DelphiError(f"{path}: file not found")
    data = path.read_bytes()
    try:
        if path.suffix in (".jsonl", ".ndjson"):
            frame = pd.read_json(path, lines=True)
        elif path.suffix == ".json":
            frame = pd.read_json(path)
        elif path.suffix == ".parquet":
            frame = pd.read_parquet(path)
        else:
            frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise DelphiError(f"{path}: empty file, expected a results table with a header row") from None
    except Exception as e:
        raise DelphiError(f"{path}: cannot read as a table ({type(e).__name__}: {e})") from None
    return str(path), frame, hashlib.sha256(data).hexdigest()


def derive_budget(flops: np.ndarray, gap_log10: float = BUDGET_GAP_LOG10) -> np.ndarray:
    """Group FLOP values into budgets: a gap wider than `gap_log10` decades starts a new one.

    Each budget is named by the geometric mean of its members, to 3 significant digits.
    """
    log_c = np.log10(np.asarray(flops, dtype=float))
    order = np.argsort(log_c)
    group = np.zeros(len(log_c), dtype=int)
    group[order] = np.concatenate([[0], np.cumsum(np.diff(log_c[order]) > gap_log10)])
    budget = np.empty(len(log_c))
    for g in np.unique(group):
        members = group == g
        budget[members] = float(f"{10 ** log_c[members].mean():.3g}")
    return budget


def check_points(table: pd.DataFrame, needed: int, method: str) -> None:
    """A fit with `needed` free parameters needs more points than that, with N and D varying."""
    n = len(table)
    if n < needed:
        raise DelphiError(f"{method}: {n} points, need at least {needed}")
    for col in ("params", "tokens"):
        if table[col].nunique() < 2:
            raise DelphiError(
                f"{method}: all {n} points have the same {col} ({table[col].iloc[0]:.4g}); "
                f"need at least 2 distinct values"
            )
    design = np.column_stack([np.ones(n), np.log(table["params"]), np.log(table["tokens"])])
    if np.linalg.matrix_rank(design, tol=1e-8 * np.abs(design).max()) < 3:
        raise DelphiError(
            f"{method}: log params and log tokens are collinear (all points on one compute "
            f"budget?); N and D effects cannot be separated"
        )


def provenance(table: pd.DataFrame) -> dict[str, Any]:
    return {
        "source": table.attrs.get("source"),
        "dropped": table.attrs.get("dropped", {}),
        "budget_derived": table.attrs.get("budget_derived", False),
        "query": table.attrs.get("query"),
    }
