"""Reading a results table's file (CSV, JSON, JSONL or Parquet) and its FLOPs family file."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from delphi.errors import QUOTED_VALUE_MAX_CHARS, DelphiError, quoted
from delphi.fits.allocation import FlopsFamily
from delphi.io import decode_utf8
from delphi.path_policy import check_input_file

FAMILY_SUFFIX = ".family.json"  # `delphi ladder collect` writes <results>.family.json beside the table


def resolve_family(
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
    path = Path(path)
    if not path.is_file():
        raise DelphiError(f"{path}: FLOPs family file not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DelphiError(f"{path}: not valid JSON ({e})") from None
    return FlopsFamily.from_json(data, str(path))


def read_table(source: str | os.PathLike | pd.DataFrame) -> tuple[str, pd.DataFrame, str]:
    """(where, the raw table, its sha256): a file read by its suffix, or a DataFrame copied (sha256 of its CSV)."""
    if isinstance(source, pd.DataFrame):
        sha = hashlib.sha256(source.to_csv(index=False).encode()).hexdigest()
        return "table", source.copy(), sha
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
        check_parquet_engine(path)
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


def check_parquet_engine(path: Path) -> None:
    """Parquet is read by pyarrow (or fastparquet), an optional dependency (`delphi[parquet]`): a
    ~40 MB wheel for one input format, and once installed pandas 3 backs every string column with it.
    Its absence is one line saying what to do, not pandas' "Unable to find a usable engine"."""
    if not any(importlib.util.find_spec(engine) for engine in ("pyarrow", "fastparquet")):
        raise DelphiError(
            f"{path}: reading Parquet needs pyarrow, which is not installed: "
            "pip install 'delphi[parquet]' (or pyarrow), or save the table as CSV"
        )


def quoted_message(error: Exception) -> str:
    """An exception's message on one line, at most QUOTED_VALUE_MAX_CHARS (it may quote the input)."""
    text = " ".join(str(error).split())
    return text if len(text) <= QUOTED_VALUE_MAX_CHARS else text[:QUOTED_VALUE_MAX_CHARS] + "..."
