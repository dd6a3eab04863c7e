"""Results tables: load, map columns, derive what is missing, validate.

Every fit reads one table with the canonical columns of docs/design.md §3.3:
`params` (N, active non-embedding), `tokens` (D), `flops` (C), `loss`, and
optionally `budget`, `run_id`, `experts`, `granularity`. Tables named
otherwise (the public reference CSVs) are mapped by column name. When only
two of N, D, C are given the third follows from C = 6 N D (Kaplan et al. 2020).

Rows whose `status` is not "completed" are dropped and counted. A loss that is
not a finite number (NaN, inf, text) in a completed row is an error naming the
rows: dropping it quietly can remove a budget's optimum and move the exponent.
Non-positive values are an error too: a negative loss or a zero parameter count
means a wrong column mapping, not a run to skip. Pass `drop_invalid=True` to drop
such rows with a count (and, given `warn`, a line naming them). The same holds for every other
column a fit uses (params, tokens, flops, budget, experts, granularity): text, an empty cell, a
null, NaN or inf is an error naming the row and column, unless dropped so. A value beyond what a fit
can compute with (FIT_MAGNITUDE_MIN .. MAX) is an error too. A row repeating an
earlier row exactly, or a run_id given to several rows, is an error too: it would count as
another seed and shrink every interval; `drop_duplicates=True` drops exact copies (a run_id
with two different rows stays an error). All losses equal
is a degenerate table, an error.

N is counted under one of PARAM_CONVENTIONS (ladder tables carry every count);
seeds of one configuration form a cell (`cell_id`), which the fits average.

The table's metadata (input sha256, drop counts, whether budgets were derived)
travels in `DataFrame.attrs` so a fit can record its provenance.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from delphi.errors import QUOTED_VALUE_MAX_CHARS, DelphiError, quoted
from delphi.fits.allocation import CONVENTION_COLUMNS, FLOPS_PER_PARAM_TOKEN, PARAM_CONVENTIONS, FlopsFamily
from delphi.query import select_rows

# Budgets are derived from `flops` when a table has no budget column: sorted log10 C values
# further apart than this start a new budget. 0.05 decades = 12%; isoFLOP grids are spaced
# far wider (Chinchilla: 6e18, 1e19, 3e19 ... = at least 0.22 decades) while digitised or
# exact-FLOP values of one budget scatter by a few percent.
BUDGET_GAP_LOG10 = 0.05

CANONICAL_COLUMNS = ("params", "tokens", "flops", "loss", "budget", "run_id", "experts", "granularity")
CANONICAL = CANONICAL_COLUMNS + ("seed", "cell_id")  # what a fit keeps: the canonical columns and the seed cells
NUMERIC = ("params", "tokens", "flops", "loss", "budget", "experts", "granularity")
FAMILY_SUFFIX = ".family.json"  # `delphi ladder collect` writes <results>.family.json beside the table
# Losses this close together (relative) carry no scaling signal: a degenerate table, not a fit.
MIN_LOSS_SPREAD_REL = 1e-9
# Columns only `delphi ladder collect` writes (delphi.ladder.collect.RESULT_COLUMNS): a table with any of
# them holds Delphi's own rung records; any other table is external (a lab's, a public sweep).
LADDER_RECORD_COLUMNS = ("params_nonembedding", "health_ok", "cell_id", "config_sha256")


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
    drop_duplicates: bool = False,
    derive_budgets: bool = True,
    params_convention: str = "nonembedding",
    family: FlopsFamily | str | os.PathLike | None = None,
    warn: Any = None,
) -> pd.DataFrame:
    """Read a results table and return it with canonical column names.

    A `*_col` left as None means "the canonical name, if the table has it";
    a name given explicitly must exist. `query` selects rows first, in the closed language of
    delphi/query.py (e.g. `"experiment == 'llama_3__raw_loss' and not outlier"`); it is never
    evaluated as Python.

    `params_convention` (PARAM_CONVENTIONS): how N is counted. A ladder table (with
    params_nonembedding / params_active / flops_per_token or flops and tokens columns) has
    its `params` taken from that convention's column; an external table keeps its `params`
    column, taken to be counted as given. `family`: a FlopsFamily or a FAMILY.json path for
    exact-FLOP allocation; when None, `<results>.family.json` beside the table is used if it
    exists, else a ladder table's own shapes (`FlopsFamily.from_table`), else none (6 N D).
    The family, its origin, the convention and the model family (moe/dense, from the
    experts column) go into `table.attrs`; `warn` (a callable taking one line, e.g. a
    print to stderr) is told which family was used.
    """
    if params_convention not in PARAM_CONVENTIONS:
        raise DelphiError(
            f"params convention {quoted(params_convention)}: expected one of {', '.join(PARAM_CONVENTIONS)}"
        )
    where, raw, sha = _read(source)
    if query:
        try:
            raw = select_rows(raw, query)
        except DelphiError as e:
            raise DelphiError(f"{where}: {e}") from None
    if raw.empty:
        raise DelphiError(f"{where}: no rows" + (f" after query {quoted(query)}" if query else ""))
    raw, duplicates_dropped = check_duplicates(raw, where, run_id_col, drop_duplicates=drop_duplicates, warn=warn)

    params_mapped = False
    if params_col is None and _is_ladder_table(raw):
        raw = raw.copy()
        if params_convention == "fpt6":
            raw["params"] = _flops_per_token(raw) / FLOPS_PER_PARAM_TOKEN
        elif CONVENTION_COLUMNS[params_convention] in raw.columns:
            raw["params"] = raw[CONVENTION_COLUMNS[params_convention]]
        else:
            raise DelphiError(
                f"{where}: no {quoted(CONVENTION_COLUMNS[params_convention])} column for params convention {quoted(params_convention)}"
            )
        params_mapped = True
    model_family = _model_family(raw, experts_col)

    mapping = {
        "params": params_col,
        "tokens": tokens_col,
        "flops": flops_col,
        "loss": loss_col,
        "budget": budget_col,
        "run_id": run_id_col,
        "experts": experts_col,
        "granularity": granularity_col,
        "seed": None,
        "cell_id": None,
    }
    table = pd.DataFrame(index=raw.index)
    for name, col in mapping.items():
        if col is not None:
            if col not in raw.columns:
                raise DelphiError(
                    f"{where}: column {quoted(col)} (for {name}) not found; columns are {list(raw.columns)}"
                )
            table[name] = raw[col]
        elif name in raw.columns:
            table[name] = raw[name]
    for name in ("params", "loss"):
        if name not in table:
            raise DelphiError(
                f"{where}: no {quoted(name)} column; map one with --{name}-col (columns are {list(raw.columns)})"
            )
    if "tokens" not in table and "flops" not in table:
        raise DelphiError(
            f"{where}: need a 'tokens' or a 'flops' column (map with --tokens-col/--flops-col); "
            f"columns are {list(raw.columns)}"
        )
    completed = (
        (raw["status"].astype(str) == "completed").to_numpy() if "status" in raw.columns else np.ones(len(raw), bool)
    )
    # A dense ladder's table carries experts = 0 (or blank): that column describes no MoE, so it
    # is left out rather than failing every row; only the MoE law needs it.
    for name in ("experts", "granularity"):
        if name in table and not (pd.to_numeric(table[name], errors="coerce") > 0).any():
            table = table.drop(columns=name)
    # A value a fit uses that is not a number (text, empty, null, NaN, inf) is a broken row, not a
    # point to lose quietly: dropping it can remove a budget's optimum and move the exponent.
    used = [c for c in NUMERIC if c in table]
    invalid_rows = _invalid_values(table, used, completed)
    shown: list[str] = []
    if invalid_rows:
        shown = [f"row {i} ({col} = {quoted(str(v), 40)})" for i, col, v in invalid_rows]
        if not drop_invalid:
            raise DelphiError(
                f"{where}: {len(shown)} value(s) a fit uses are not finite numbers: {', '.join(shown[:10])}"
                f"{' ...' if len(shown) > 10 else ''}; fix or remove them, or pass --drop-invalid to drop their rows"
            )
        if warn is not None:
            warn(
                f"WARNING: {where}: dropped {len({i for i, _, _ in invalid_rows})} row(s) with a value that is not a "
                f"finite number: {', '.join(shown)}"
            )
    for name in NUMERIC:
        if name in table:
            table[name] = pd.to_numeric(table[name], errors="coerce").astype(float)
    if "run_id" in table:
        table["run_id"] = table["run_id"].astype(str)
    if "cell_id" in table:
        table["cell_id"] = table["cell_id"].astype(str)

    dropped: dict[str, int] = {"duplicates": duplicates_dropped} if duplicates_dropped else {}
    if (~completed).any():
        dropped["status_not_completed"] = int((~completed).sum())
        table = table[completed]

    needed = [c for c in used if c in table]
    finite = np.isfinite(table[needed].to_numpy(dtype=float)).all(axis=1)
    if (~finite).any():  # only with drop_invalid: the rows named above
        dropped["nan_or_inf"] = int((~finite).sum())
        table = table[finite]

    positive = (table[needed].to_numpy(dtype=float) > 0).all(axis=1)
    if (~positive).any():
        if not drop_invalid:
            row = int(np.flatnonzero(~positive)[0])
            bad = [c for c in needed if not table[c].iloc[row] > 0][0]
            raise DelphiError(
                f"{where}: row {table.index[row]}: {bad} = {quoted(float(table[bad].iloc[row]))}, expected > 0 "
                f"({int((~positive).sum())} such rows; --drop-invalid drops them)"
            )
        dropped["non_positive"] = int((~positive).sum())
        table = table[positive]

    if table.empty:
        raise DelphiError(f"{where}: no usable rows left (dropped: {dropped})")
    loss = table["loss"].to_numpy(float)
    if len(loss) > 1 and loss.max() - loss.min() <= MIN_LOSS_SPREAD_REL * abs(loss.max()):
        raise DelphiError(
            f"{where}: all {len(loss)} losses are equal ({loss[0]:.6g}); a degenerate table, nothing to fit"
        )

    if "tokens" not in table:
        table["tokens"] = table["flops"] / (FLOPS_PER_PARAM_TOKEN * table["params"])
    if "flops" not in table:
        table["flops"] = FLOPS_PER_PARAM_TOKEN * table["params"] * table["tokens"]
    check_magnitudes(table, where)
    budget_derived = False
    if "budget" not in table and derive_budgets:
        table["budget"] = derive_budget(table["flops"].to_numpy())
        budget_derived = True

    if "cell_id" not in table and "budget" in table and "seed" in table:
        # Replicates of one configuration (several seeds) form a cell: budget x shape.
        key_cols = [c for c in ("budget", "params", "tokens", "experts", "granularity") if c in table]
        keys = table[key_cols].astype(float).map(lambda v: f"{v:.9g}").agg("|".join, axis=1)
        if keys.duplicated().any():
            table["cell_id"] = keys

    # Anchor rungs (a ladder spec's long rungs, results column `role`) are no budget's isoFLOP
    # points: they ride along in attrs, for the laws in (N, D) only (`with_anchors`).
    anchor = raw.loc[table.index, "role"].astype(str).eq(ANCHOR_ROLE).to_numpy() if "role" in raw.columns else None
    anchor_rows = table[anchor][[c for c in CANONICAL if c in table]].to_dict("records") if anchor is not None else []
    if anchor is not None and anchor.any():
        table = table[~anchor]
        if table.empty:
            raise DelphiError(f"{where}: only anchor rungs (role = {quoted(ANCHOR_ROLE)}); no isoFLOP points to fit")
    table = table[[c for c in CANONICAL if c in table]].reset_index(drop=True)
    flops_family, family_origin = _resolve_family(family, source, raw, params_convention, params_mapped, where)
    if warn is not None and flops_family is not None:
        warn(f"{where}: exact-FLOP allocation with the FLOPs family from {family_origin} ({params_convention} params)")
    table.attrs.update(
        {
            "source": where,
            "sha256": sha,
            "dropped": dropped,
            "budget_derived": budget_derived,
            "query": query,
            "params_convention": params_convention,
            "params_mapped": params_mapped,
            "flops_family": flops_family,
            "family_origin": family_origin,
            "model_family": model_family,
            "invalid_rows_dropped": shown,
            "anchor_rows": anchor_rows,
            "ladder_records": bool(set(LADDER_RECORD_COLUMNS) & set(raw.columns)),
            "columns": {name: col for name, col in mapping.items() if col is not None},
        }
    )
    return table


ANCHOR_ROLE = "anchor"  # results column `role` of a ladder spec's anchor rungs (delphi.ladder.plan.rung_role)

# The magnitudes a fit can compute with: float64 holds up to ~1.8e308, and a fit squares its values
# and multiplies two of them (C = 6 N D, residuals squared), so each stays within 1e-150 .. 1e150. Real
# tables sit far inside (losses ~1-10 nats, N and D up to ~1e13, C up to ~1e27).
FIT_MAGNITUDE_MIN, FIT_MAGNITUDE_MAX = 1e-150, 1e150


def _invalid_values(table: pd.DataFrame, columns: list[str], completed: np.ndarray) -> list[tuple[Any, str, Any]]:
    """(row, column, value) of each value in `columns` of a completed row that is not a finite number."""
    out = []
    for col in columns:
        numbers = pd.to_numeric(table[col], errors="coerce").astype(float).to_numpy()
        bad = ~np.isfinite(numbers) & completed
        out += [(table.index[k], col, table[col].iloc[k]) for k in np.flatnonzero(bad)]
    return sorted(out, key=lambda x: (list(table.index).index(x[0]), columns.index(x[1])))


def check_magnitudes(table: pd.DataFrame, where: str) -> None:
    """Refuse a value a fit cannot compute with (FIT_MAGNITUDE_MIN..MAX), naming its row and column
    (a derived D = C / 6N or C = 6ND that overflows included)."""
    for col in [c for c in NUMERIC if c in table]:
        values = table[col].to_numpy(dtype=float)
        bad = ~((values >= FIT_MAGNITUDE_MIN) & (values <= FIT_MAGNITUDE_MAX))
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise DelphiError(
                f"{where}: row {table.index[k]}: {col} = {quoted(float(values[k]))} is beyond what a fit can "
                f"compute with ({FIT_MAGNITUDE_MIN:g} .. {FIT_MAGNITUDE_MAX:g}: float64 overflows its square); "
                f"{int(bad.sum())} such row(s); check the column's units"
            )


def with_anchors(table: pd.DataFrame) -> pd.DataFrame:
    """`table` plus the anchor rungs `load_results` set aside (what the laws in (N, D) fit); the
    table itself when it has none."""
    rows = table.attrs.get("anchor_rows") or []
    if not rows:
        return table
    out = pd.concat([table, pd.DataFrame(rows)], ignore_index=True)
    out.attrs = {k: v for k, v in table.attrs.items() if k != "anchor_rows"}
    return out


def isoflop_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a results table that belong to a budget's isoFLOP set (not anchor rungs)."""
    return table[table["role"].astype(str) != ANCHOR_ROLE] if "role" in table.columns else table


def _is_ladder_table(raw: pd.DataFrame) -> bool:
    """A delphi ladder's results table carries its parameter counts under every convention."""
    return "params_nonembedding" in raw.columns and "params_active" in raw.columns


def _flops_per_token(raw: pd.DataFrame) -> pd.Series:
    if "flops_per_token" in raw.columns:
        return pd.to_numeric(raw["flops_per_token"], errors="coerce")
    return pd.to_numeric(raw["flops"], errors="coerce") / pd.to_numeric(raw["tokens"], errors="coerce")


def _model_family(raw: pd.DataFrame, experts_col: str | None) -> str | None:
    """moe / dense from the table's expert counts; None when the table does not say."""
    col = experts_col or "experts"
    if col not in raw.columns:
        return "dense" if _is_ladder_table(raw) else None
    experts = pd.to_numeric(raw[col], errors="coerce")
    return "moe" if (experts > 1).any() else "dense"


def _resolve_family(
    family: FlopsFamily | str | os.PathLike | None,
    source: Any,
    raw: pd.DataFrame,
    convention: str,
    params_mapped: bool,
    where: str,
) -> tuple[FlopsFamily | None, str | None]:
    """(family, where it came from): given > <results>.family.json > the ladder table's rows > none."""
    if isinstance(family, FlopsFamily):
        origin = family.source
    elif family is not None:
        family, origin = read_family(family), str(family)
    else:
        beside = Path(str(source) + FAMILY_SUFFIX) if isinstance(source, (str, os.PathLike)) else None
        if beside is not None and beside.is_file():
            family, origin = read_family(beside), str(beside)
            if family.convention != convention:
                family = None  # counted another way: the table's own shapes below give this convention
        if family is None and params_mapped:
            family = FlopsFamily.from_table(raw, convention, source=f"{where} rows")
            origin = f"the table's own shapes ({where}; no {Path(str(source)).name}{FAMILY_SUFFIX})"
        if family is None:
            return None, None
    if family.convention != convention:
        raise DelphiError(
            f"{origin}: the FLOPs family counts N as {quoted(family.convention)} but the fit uses {quoted(convention)} "
            f"(--params-convention {family.convention}, or a family written for {convention})"
        )
    return family, origin


def read_family(path: str | os.PathLike) -> FlopsFamily:
    """A FAMILY.json written by `delphi ladder family` / `delphi ladder collect`."""
    import json

    path = Path(path)
    if not path.is_file():
        raise DelphiError(f"{path}: FLOPs family file not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DelphiError(f"{path}: not valid JSON ({e})") from None
    return FlopsFamily.from_json(data, str(path))


def _read(source: str | os.PathLike | pd.DataFrame) -> tuple[str, pd.DataFrame, str]:
    if isinstance(source, pd.DataFrame):
        sha = hashlib.sha256(source.to_csv(index=False).encode()).hexdigest()
        return "table", source.copy(), sha
    from delphi.io import decode_utf8
    from delphi.path_policy import check_input_file

    # `-`, /dev/null, a FIFO or a process substitution: said what it is, not "not found"
    path = check_input_file(source, "results table file (CSV, JSON, JSONL or Parquet)", not_found="file not found")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DelphiError(f"{path}: cannot read ({e.strerror})") from None
    # Text formats are decoded here, not by pandas, whose error gives the position in its read
    # buffer ("position 0") rather than the line of the bad byte.
    text = None if path.suffix == ".parquet" else decode_utf8(data, path, "results table")
    if path.suffix == ".parquet":
        _check_parquet_engine(path)
    try:
        if path.suffix in (".jsonl", ".ndjson"):
            frame = pd.read_json(io.StringIO(text), lines=True)
        elif path.suffix == ".json":
            frame = pd.read_json(io.StringIO(text))
        elif path.suffix == ".parquet":
            frame = pd.read_parquet(path)
        else:
            frame = pd.read_csv(io.StringIO(text))
    except pd.errors.EmptyDataError:
        raise DelphiError(f"{path}: empty file, expected a results table with a header row") from None
    except Exception as e:
        raise DelphiError(f"{path}: cannot read as a table ({type(e).__name__}: {quoted_message(e)})") from None
    return str(path), frame, hashlib.sha256(data).hexdigest()


def _check_parquet_engine(path: Path) -> None:
    """Parquet is read by pyarrow (or fastparquet), an optional dependency (`delphi[parquet]`): a
    ~40 MB wheel for one input format, and once installed pandas 3 backs every string column with it.
    Its absence is one line saying what to do, not pandas' "Unable to find a usable engine"."""
    import importlib.util

    if not any(importlib.util.find_spec(engine) for engine in ("pyarrow", "fastparquet")):
        raise DelphiError(
            f"{path}: reading Parquet needs pyarrow, which is not installed: "
            "pip install 'delphi[parquet]' (or pyarrow), or save the table as CSV"
        )


def quoted_message(error: Exception) -> str:
    """An exception's message on one line, at most QUOTED_VALUE_MAX_CHARS (it may quote the input)."""
    text = " ".join(str(error).split())
    return text if len(text) <= QUOTED_VALUE_MAX_CHARS else text[:QUOTED_VALUE_MAX_CHARS] + "..."


def _rows_named(index: list, limit: int = 10) -> str:
    shown = ", ".join(str(i) for i in index[:limit])
    return shown + (f" ... ({len(index)} in all)" if len(index) > limit else "")


def check_duplicates(
    raw: pd.DataFrame, where: str, run_id_col: str | None, *, drop_duplicates: bool = False, warn: Any = None
) -> tuple[pd.DataFrame, int]:
    """The table without duplicates, and how many rows were dropped.

    A row equal to an earlier one in every column, or a run_id given to more than one row, would be
    counted as another seed of its cell: the seed noise and every interval would shrink. Both are a
    DelphiError naming the rows, unless `drop_duplicates`, which drops exact copies (keeping the
    first, named to `warn`). Rows sharing a run_id with different values stay an error even then:
    which of them is the run cannot be told from the table.
    """
    # Rows compared as text: a JSON table's cells may be lists (unhashable); NaN equals NaN as "nan".
    row_keys = pd.Series(
        ["\x1f".join(map(repr, row)) for row in raw.astype(object).itertuples(index=False)],
        index=raw.index,
        dtype=object,
    )
    exact = row_keys.duplicated(keep="first")
    column = run_id_col if run_id_col is not None else ("run_id" if "run_id" in raw.columns else None)
    if column is not None and column in raw.columns:
        ids = raw[column].astype(str)
        conflicting = ids.duplicated(keep=False) & ~row_keys.duplicated(keep=False)
        if conflicting.any():
            first = ids[conflicting].iloc[0]
            rows = list(raw.index[(ids == first).to_numpy()])
            n_ids = ids[conflicting].nunique()
            raise DelphiError(
                f"{where}: run_id {quoted(first)} is given to {len(rows)} rows with different values (rows "
                f"{_rows_named(rows)}){f'; {n_ids} run_ids in all' if n_ids > 1 else ''}; one run, one row: "
                "remove the wrong rows"
            )
    if not exact.any():
        return raw, 0
    rows = list(raw.index[exact.to_numpy()])
    if not drop_duplicates:
        original = raw.index[(row_keys == row_keys.loc[rows[0]]).to_numpy()][0]
        raise DelphiError(
            f"{where}: {len(rows)} row(s) repeat an earlier row exactly (rows {_rows_named(rows)}; row {rows[0]} "
            f"repeats row {original}); a repeated run would count as another seed and shrink the intervals: "
            "remove them, or pass --drop-duplicates to drop them"
        )
    if warn is not None:
        warn(f"WARNING: {where}: dropped {len(rows)} row(s) repeating an earlier row exactly: rows {_rows_named(rows)}")
    return raw[~exact.to_numpy()], len(rows)


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
        "params_convention": table.attrs.get("params_convention"),
        "flops_family_origin": table.attrs.get("family_origin"),
        "table": table_record(table),
    }


def table_record(table: pd.DataFrame) -> dict[str, Any]:
    """What a fit keeps about its table for the readers that no longer have it (`delphi predict`'s
    choice of point, delphi.fits.best_point): whether it is Delphi's own rung records, the column
    mapping it was read with, and what the sweep features are made of (`beyond.record_features`):
    the median model size and the distinct sizes at each budget."""
    out: dict[str, Any] = {
        "ladder_records": bool(table.attrs.get("ladder_records", False)),
        "columns": dict(table.attrs.get("columns") or {}),
    }
    if "budget" in table and "params" in table and len(table):
        rows = isoflop_rows(table)
        out["log10_median_params"] = float(np.log10(rows["params"].median()))
        out["sizes_per_budget"] = {f"{b:.6g}": int(n) for b, n in rows.groupby("budget")["params"].nunique().items()}
    return out


def cell_points(table: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The points a fit uses: one per cell (budget x shape), at the mean loss of its seeds.

    Each point gets a `weight` proportional to 1 / SE^2 of its mean, SE = pooled within-cell
    std / sqrt(n_seeds): the per-cell std of 2-3 seeds is itself too noisy to weight by (two
    seeds that happen to agree would get near-infinite weight), while the pooled std is one
    estimate from every cell. Weights are normalised to mean 1, so a table with one run per
    cell is fitted exactly as before. Returns (points, info) with info["seed_noise_nats"] =
    the pooled within-cell std (None without replicates).
    """
    info: dict[str, Any] = {"n_runs": len(table), "seed_noise_nats": None}
    if "cell_id" not in table or not table["cell_id"].duplicated().any():
        points = table.copy()
        points["weight"] = 1.0
        points["n_seeds"] = 1
        info["n_cells"] = len(points)
        points.attrs = dict(table.attrs)
        return points, info
    grouped = table.groupby("cell_id", sort=False)
    points = grouped.first()
    points["loss"] = grouped["loss"].mean()
    points["n_seeds"] = grouped["loss"].size()
    var = grouped["loss"].var(ddof=1)
    dof = points["n_seeds"] - 1
    replicated = dof > 0
    pooled = float(np.sqrt((var[replicated] * dof[replicated]).sum() / dof[replicated].sum()))
    points["weight"] = points["n_seeds"] / points["n_seeds"].mean()
    points = points.reset_index()
    points.attrs = dict(table.attrs)
    info.update({"n_cells": len(points), "seed_noise_nats": pooled, "seeds_per_cell_max": int(points["n_seeds"].max())})
    return points, info


@dataclass(frozen=True)
class TableOptions:
    """How a user asked for a results table to be read: `load_results`' column mapping (canonical name,
    the table's column), row query and what to drop. `delphi fit` and `delphi prereg create` build one
    from the same flags (delphi.cli.table_options)."""

    columns: tuple[tuple[str, str], ...] = ()
    query: str | None = None
    drop_invalid: bool = False
    drop_duplicates: bool = False

    def load_kwargs(self) -> dict[str, Any]:
        return {
            **{f"{name}_col": col for name, col in self.columns},
            "query": self.query,
            "drop_invalid": self.drop_invalid,
            "drop_duplicates": self.drop_duplicates,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "columns": dict(self.columns),
            "query": self.query,
            "drop_invalid": self.drop_invalid,
            "drop_duplicates": self.drop_duplicates,
        }

    @property
    def is_default(self) -> bool:
        return self == TableOptions()
