"""The coverage table's rows and counts, and the checked reading of the files they come from.

A row counts how often a source's 50% and 90% intervals covered what happened (`make_row`), flagged
against the target band (`flag_90`); every reader names the file, line and column of a bad value.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError, quoted
from delphi.io import read_text

BAND_90 = (0.85, 0.95)  # the target band for a 90% interval's empirical coverage
MIN_POINTS = 10  # fewer points than this say little about a 90% interval (one miss moves it >= 10 points)
WITHIN, OUTSIDE, TOO_FEW = "within 85-95%", "outside 85-95%", f"too few points (n<{MIN_POINTS})"


# --------------------------------------------------------------------------- rows and counts


def count(hits: Iterable[bool | None]) -> dict[str, int] | None:
    """{"k": covered, "n": points with an interval}; None when no point had one (not recorded)."""
    known = [bool(h) for h in hits if h is not None]
    return {"k": sum(known), "n": len(known)} if known else None


def covered(interval: Sequence[float] | None, observed: float) -> bool | None:
    """lo <= observed <= hi; None without an interval."""
    if interval is None:
        return None
    return bool(interval[0] <= observed <= interval[1])


def flag_90(c90: dict[str, int] | None) -> str:
    if c90 is None:
        return "no 90% interval recorded"
    if c90["n"] < MIN_POINTS:
        return TOO_FEW
    share = c90["k"] / c90["n"]
    return WITHIN if BAND_90[0] <= share <= BAND_90[1] else OUTSIDE


def make_row(
    label: str,
    source: str,
    n: int,
    hits_50: Iterable[bool | None] | None,
    hits_90: Iterable[bool | None],
    *,
    section: str,
    notes: Sequence[str] = (),
    **extra: Any,
) -> dict[str, Any]:
    """One row of the table: `hits_50` None means the source records no 50% interval."""
    c50 = None if hits_50 is None else count(hits_50)
    c90 = count(hits_90)
    return {
        "section": section,
        "label": label,
        "source": source,
        "n": n,
        "covered_50": c50,
        "covered_90": c90,
        "coverage_50": None if c50 is None or not c50["n"] else c50["k"] / c50["n"],
        "coverage_90": None if c90 is None or not c90["n"] else c90["k"] / c90["n"],
        "flag": flag_90(c90),
        **extra,
        "notes": list(notes),
    }


def shown(path: Path, root: Path) -> str:
    """A path as the table names it: relative to the repository root when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- reading


def read_csv_rows(path: Path, what: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """(columns, [(line, row)]) of a CSV file; unreadable or malformed is a DelphiError naming it."""
    text = read_text(path, what=what)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = []
    try:
        columns = list(reader.fieldnames or [])
        for row in reader:
            rows.append((reader.line_num, row))
    except csv.Error as e:
        raise DelphiError(f"{path}: not a valid CSV file (line {reader.line_num}: {e})") from None
    if not columns:
        raise DelphiError(f"{path}: empty; expected a {what} with a header line")
    return columns, rows


def require_columns(path: Path, columns: Sequence[str], needed: Sequence[str], what: str) -> None:
    for column in needed:
        if column not in columns:
            raise DelphiError(f"{path}: no column {column!r} (a {what} needs {', '.join(needed)})")


def number(path: Path, line: int | str, column: str, value: Any, *, empty_ok: bool = False) -> float | None:
    """A finite number from a cell or a key; empty (when allowed) is None."""
    if value is None or (isinstance(value, str) and not value.strip()):
        if empty_ok:
            return None
        raise DelphiError(f"{path}: {line_where(line)}{column!r} is empty; expected a number")
    if isinstance(value, bool):
        raise DelphiError(f"{path}: {line_where(line)}{column!r} is {quoted(value)}; expected a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DelphiError(f"{path}: {line_where(line)}{column!r} is {quoted(value)}; expected a number") from None
    if not math.isfinite(number):
        if empty_ok and math.isnan(number):
            return None  # pandas writes a missing interval as an empty cell, but a hand edit may say nan
        raise DelphiError(
            f"{path}: {line_where(line)}{column!r} is {quoted(value)}; expected a finite number"
            + (" (an infinite bound is not a missing one)" if empty_ok else "")
        )
    return number


def line_where(line: int | str) -> str:
    return f"line {line}, column " if isinstance(line, int) else (f"{line}: " if line else "")


def boolean(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if value is not None else ""
    return {"true": True, "false": False}.get(text)


def interval_of(path: Path, line: int | str, lo_key: str, hi_key: str, lo: Any, hi: Any) -> tuple[float, float] | None:
    a, b = number(path, line, lo_key, lo, empty_ok=True), number(path, line, hi_key, hi, empty_ok=True)
    if a is None or b is None:
        return None
    if a > b:
        raise DelphiError(
            f"{path}: {line_where(line)}{lo_key!r} {a:g} is above {hi_key!r} {b:g}; expected an interval lo <= hi"
        )
    return a, b
