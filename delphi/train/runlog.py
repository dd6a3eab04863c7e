"""A training run's log, from any trainer, as one typed table of eval points (`RunState`): one concept
over ~750 lines (reading every log format into that table).

What `prereg check`, `plot prediction|frontier --run` and `delphi report` read a run from:

- a Delphi run dir (config.yaml, status.json, metrics.jsonl, summary.json): `read_run_dir`, as the
  trainer writes it (docs/design.md §3.2); its status and summary say when it ended;
- a metrics log written by any trainer (`read_log`): JSON lines (`.jsonl`, `.ndjson`), a JSON array
  of records or pandas' column mapping (`.json`), CSV (`.csv`) or TSV (`.tsv`, `.tab`); a W&B history
  export is one of these (`_step`, `_timestamp`, `_runtime`, keys such as `eval/loss`);
- a directory holding exactly one such log and none of a Delphi run dir's files.

`read_run` picks among them. A log's columns are found by name: the mapping given (`LogColumns`),
else the first of each quantity's aliases present (exact, then ignoring case). A log says nothing
about its end: `reach_end` marks it completed once an eval reaches the tokens or steps it must reach
(`RunEnd`, e.g. a preregistered hero's); `read_to_end` reads a run and does both.

The rules a log must follow (each break is a DelphiError naming the file, line and column): an
eval loss is a finite number (an empty cell, a missing key or JSON null is a row without an eval);
steps never go backwards and no two evals share a step; a time is epoch seconds or ISO 8601 with a
zone. A last line without its newline is being written and is skipped.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from delphi.errors import CheckFailed, DelphiError, quoted
from delphi.io import decode_utf8
from delphi.path_policy import check_input_file
from delphi.train.config import train_config_from_dict
from delphi.train.rundir import (
    CONFIG_FILE,
    METRICS_FILE,
    STATUS_FILE,
    SUMMARY_FILE,
    read_json_object,
    read_metrics,
    stopped_before_end,
    summary_log_problem,
)

# The names each quantity is looked for under, in order: Delphi's own first, then the usual names of
# other trainers and of W&B (HF Trainer: global_step, eval_loss; nanoGPT: iter; W&B: _step, _timestamp).
# A bare `loss` is not an eval loss alias: most trainers log the training loss under it.
STEP_ALIASES = ("step", "_step", "iter", "iteration", "global_step", "train/global_step", "trainer/global_step")
TOKENS_ALIASES = (
    "tokens",
    "tokens_seen",
    "num_tokens",
    "n_tokens",
    "total_tokens",
    "consumed_tokens",
    "train/tokens",
    "throughput/total_tokens",
)
LOSS_ALIASES = (
    "val_loss",
    "eval_loss",
    "eval/loss",
    "val/loss",
    "validation/loss",
    "valid/loss",
    "validation_loss",
    "valid_loss",
    "eval/val_loss",
)
TIME_ALIASES = ("time", "timestamp", "_timestamp", "wall_time", "walltime", "unix_time")
ALIASES = {"step": STEP_ALIASES, "tokens": TOKENS_ALIASES, "loss": LOSS_ALIASES, "time": TIME_ALIASES}
LABELS = {"step": "step", "tokens": "tokens", "loss": "eval loss", "time": "time"}

JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")
LOG_SUFFIXES = (*JSON_LINES_SUFFIXES, ".json", ".csv", ".tsv", ".tab")
DELPHI_RUN_FILES = (CONFIG_FILE, STATUS_FILE, SUMMARY_FILE)  # a directory with one of these is a Delphi run dir

# Times before this (September 2001) are not wall-clock epoch seconds: a column of elapsed seconds
# mapped as the time would date the run to 1970 and call every seal late.
MIN_EPOCH_S = 1e9
# Times above this are milliseconds (or finer) since the epoch, not seconds (year 5138).
MAX_EPOCH_S = 1e11
# An eval at the hero's tokens written as text (CSV, a float's shortest repr) may read back this far below them.
TEXT_ROUNDING_REL = 1e-9
# A log declared finished (--finished) whose last eval lies this close below the hero's tokens has
# reached them: a trainer's last batch may round its count, and 0.1% of the tokens moves a
# Chinchilla-shaped loss by ~0.003%, far inside any tolerance. A live log ends only on the tokens
# themselves: evals this close together near the end would otherwise end it one eval early.
END_TOLERANCE_REL = 1e-3

Kind = Literal["run_dir", "log", "wandb"]


@dataclass(frozen=True)
class LogColumns:
    """Which column of a log holds each quantity; None: the first of its aliases the log has."""

    step: str | None = None
    tokens: str | None = None
    loss: str | None = None
    time: str | None = None

    def given(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class LogOptions:
    """How to read a log: its column mapping, and whether it is declared complete (`reach_end`)."""

    columns: LogColumns = LogColumns()
    finished: bool = False


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation: the step (None when the log has no step column), the tokens trained so far
    (None when neither a column nor the tokens per step give them) and the eval loss (nats)."""

    step: int | None
    tokens: float | None
    loss: float


@dataclass
class RunState:
    """A run as a check reads it, wherever it came from (a Delphi run dir, a log, W&B)."""

    source: str
    status: str  # pending | running | stopped (resumable) | completed | diverged | failed | unknown
    evals: list[EvalPoint]  # in step order
    final_loss: float | None = None  # the final eval loss once the run has ended
    final_bpb: float | None = None
    first_step_time: float | None = None  # epoch seconds of the first logged row
    reason: str | None = None
    kind: Kind = "run_dir"
    path: Path | None = None  # the run dir or the log file
    n_rows: int = 0  # rows logged (evals or not)
    latest_step: int | None = None  # the last logged row's, eval or not
    latest_tokens: float | None = None
    columns: dict[str, str] = field(default_factory=dict)  # a log's: quantity -> where it was read from


class ColumnNotFound(DelphiError):
    """A quantity a log must have is not among its columns. `sparse`: the log's columns are the keys
    of the rows written so far (JSON), so a column an eval row brings may still come."""

    def __init__(self, message: str, *, sparse: bool) -> None:
        super().__init__(message)
        self.sparse = sparse


# --------------------------------------------------------------------------- which reader


def is_delphi_run_dir(path: Path) -> bool:
    """A directory Delphi's trainer writes (or will: an empty one), rather than another trainer's log."""
    return path.is_dir() and (any((path / name).exists() for name in DELPHI_RUN_FILES) or not log_files(path))


def log_files(directory: Path) -> list[Path]:
    """The metrics logs a directory holds (by suffix), sorted."""
    try:
        return sorted(p for p in directory.iterdir() if p.suffix.lower() in LOG_SUFFIXES and p.is_file())
    except OSError as e:
        raise DelphiError(f"{directory}: cannot list ({e.strerror})") from None


def log_path(path: str | os.PathLike) -> Path:
    """The log file `path` names: itself, or the one log in a directory."""
    path = Path(path)
    if not path.is_dir():
        return check_input_file(
            path, "metrics log (JSONL, CSV, TSV or JSON)", not_found="run dir or metrics log not found"
        )
    found = log_files(path)
    if len(found) != 1:
        raise DelphiError(
            f"{path}: holds {len(found)} metrics logs ({', '.join(p.name for p in found) or 'none'}); "
            f"give the log file itself (one of {', '.join(LOG_SUFFIXES)})"
        )
    return found[0]


def read_run(
    path: str | os.PathLike, columns: LogColumns = LogColumns(), *, tokens_per_step: float | None = None
) -> RunState:
    """A Delphi run dir (`read_run_dir`), or a log file or a directory holding one (`read_log`).
    A column mapping given for a Delphi run dir is refused: its own names are read."""
    path = Path(path)
    if not path.exists():
        raise DelphiError(f"{path}: run dir or metrics log not found")
    if is_delphi_run_dir(path):
        if given := columns.given():
            mapping = ", ".join(f"{LABELS[k]} = {quoted(v, 60)}" for k, v in given.items())
            raise DelphiError(
                f"{path} is a Delphi run dir, read by its own column names (step, tokens, val_loss, time); "
                f"a column mapping ({mapping}) is for another trainer's log"
            )
        return read_run_dir(path)
    return read_log(log_path(path), columns, tokens_per_step=tokens_per_step)


# --------------------------------------------------------------------------- a Delphi run dir


def first_step_time(run_dir: Path, rows: list[dict]) -> float | None:
    """When the first step was logged: its own timestamp if the row has one, else
    the metrics file's mtime minus the wall time elapsed since the first row
    (the file is flushed per line, so its mtime is the last row's time)."""
    if not rows:
        return None
    for key in ("time", "timestamp"):
        if isinstance(rows[0].get(key), (int, float)):
            return float(rows[0][key])
    mtime = (run_dir / METRICS_FILE).stat().st_mtime
    first, last = rows[0].get("wall_s"), rows[-1].get("wall_s")
    if isinstance(first, (int, float)) and isinstance(last, (int, float)):
        return mtime - (float(last) - float(first))
    return mtime if len(rows) == 1 else None


def read_run_dir(run_dir: str | Path) -> RunState:
    """A Delphi run dir as its trainer wrote it: the evals are its metrics rows with a val_loss; the
    status and final loss are status.json's and summary.json's. A summary that disagrees with the
    metrics log is CheckFailed (an edited record must not decide a verdict)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise DelphiError(f"{run_dir}: run dir not found")
    status = read_json_object(run_dir / STATUS_FILE)  # {} while being replaced; the next poll reads it
    rows = read_metrics(run_dir)
    summary = read_json_object(run_dir / SUMMARY_FILE)
    if problem := summary_log_problem(run_dir):
        raise CheckFailed(f"{problem}; nothing compared, no outcome written")
    evals = [
        EvalPoint(int(r["step"]), None if r.get("tokens") is None else float(r["tokens"]), float(r["val_loss"]))
        for r in rows
        if r.get("val_loss") is not None
    ]
    with_tokens = [r for r in rows if r.get("tokens") is not None]
    return RunState(
        source=str(run_dir),
        status="stopped" if stopped_before_end(status) else status.get("status", "pending" if not rows else "unknown"),
        evals=evals,
        final_loss=summary.get("val_loss"),
        final_bpb=summary.get("val_bpb"),
        first_step_time=first_step_time(run_dir, rows),
        reason=status.get("reason"),
        kind="run_dir",
        path=run_dir,
        n_rows=len(rows),
        latest_step=int(rows[-1]["step"]) if rows and rows[-1].get("step") is not None else None,
        latest_tokens=float(with_tokens[-1]["tokens"]) if with_tokens else None,
    )


# --------------------------------------------------------------------------- another trainer's log


@dataclass(frozen=True)
class Record:
    """One row of a log and where it is (`FILE:LINE` or `FILE: record N`)."""

    where: str
    values: dict[str, Any]
    text: bool  # values are CSV/TSV text (numbers still to parse), not JSON values


def read_log(
    path: str | os.PathLike, columns: LogColumns = LogColumns(), *, tokens_per_step: float | None = None
) -> RunState:
    """Another trainer's metrics log as a RunState: status `pending` (no row yet) or `running`; its
    end is for the caller to judge (`reach_end`). `tokens_per_step` gives the tokens of a log without
    a tokens column (step x tokens per step)."""
    path = check_input_file(path, "metrics log (JSONL, CSV, TSV or JSON)", not_found="metrics log not found")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DelphiError(f"{path}: cannot read ({e.strerror})") from None
    records, found, sparse = parse_log(path, decode_utf8(data, path, "metrics log"))
    return replace(
        log_state(str(path), records, found, columns, sparse=sparse, tokens_per_step=tokens_per_step), path=path
    )


def parse_log(path: Path, text: str) -> tuple[list[Record], list[str], bool]:
    """(records, the columns found in order, whether the columns are only the keys seen so far)."""
    suffix = path.suffix.lower()
    if suffix in JSON_LINES_SUFFIXES:
        records = _json_lines(path, text)
    elif suffix == ".json":
        records = _json_document(path, text)
    elif suffix in (".csv", ".tsv", ".tab"):
        header, records = _delimited(path, text, "," if suffix == ".csv" else "\t")
        return records, header, False
    else:
        raise DelphiError(
            f"{path}: unknown metrics log format {quoted(path.suffix)}; expected one of {', '.join(LOG_SUFFIXES)}"
        )
    found: dict[str, None] = {}
    for record in records:
        found.update(dict.fromkeys(record.values))
    return records, list(found), True


def _json_lines(path: Path, text: str) -> list[Record]:
    lines = text.split("\n")
    complete = lines[:-1]  # the last piece has no newline yet: a trainer is writing it
    records = []
    for i, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            raise DelphiError(f"{path}:{i}: not valid JSON; expected one JSON object per line") from None
        if not isinstance(value, dict):
            raise DelphiError(f"{path}:{i}: expected one JSON object per line, got {type(value).__name__}")
        records.append(Record(f"{path}:{i}", value, text=False))
    return records


def _json_document(path: Path, text: str) -> list[Record]:
    """A JSON array of records (`run.history().to_json(orient="records")`, a list of `scan_history()`
    rows), or pandas' default column mapping {column: {index: value}} or {column: [values]}."""
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except ValueError as e:
        raise DelphiError(f"{path}: not valid JSON ({e}); a log being written should be JSON lines (.jsonl)") from None
    if isinstance(data, dict) and data and all(isinstance(v, (dict, list)) for v in data.values()):
        columns = {k: (list(v.values()) if isinstance(v, dict) else v) for k, v in data.items()}
        lengths = {len(v) for v in columns.values()}
        if len(lengths) != 1:
            raise DelphiError(f"{path}: a column mapping whose columns have different lengths {sorted(lengths)}")
        data = [{k: v[i] for k, v in columns.items()} for i in range(lengths.pop())]
    if not isinstance(data, list):
        raise DelphiError(
            f"{path}: expected a JSON array of records (one object per logged row), got {type(data).__name__}"
        )
    records = []
    for i, value in enumerate(data, start=1):
        if not isinstance(value, dict):
            raise DelphiError(f"{path}: record {i}: expected a JSON object, got {type(value).__name__}")
        records.append(Record(f"{path}: record {i}", {k: v for k, v in value.items() if v is not None}, text=False))
    return records


def _delimited(path: Path, text: str, delimiter: str) -> tuple[list[str], list[Record]]:
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # the last line has no newline yet: a trainer is writing it
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    try:
        header = next(reader, None)
        if header is None:
            return [], []
        records = []
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise DelphiError(
                    f"{path}:{reader.line_num}: {len(row)} fields, the header has {len(header)} ({', '.join(header)})"
                )
            records.append(
                Record(f"{path}:{reader.line_num}", {k: v for k, v in zip(header, row) if v.strip() != ""}, text=True)
            )
    except csv.Error as e:
        raise DelphiError(f"{path}:{reader.line_num}: not a {'CSV' if delimiter == ',' else 'TSV'} row ({e})") from None
    return header, records


def resolve_columns(where: str, found: list[str], columns: LogColumns, *, sparse: bool) -> dict[str, str]:
    """quantity -> column: the mapping given (it must be there), else the first alias present."""
    resolved: dict[str, str] = {}
    for quantity, aliases in ALIASES.items():
        given = getattr(columns, quantity)
        if given is not None:
            if given not in found:
                raise ColumnNotFound(
                    f"{where}: column {quoted(given)} (mapped to the {LABELS[quantity]}) not found; "
                    f"{_columns_line(found, sparse)}",
                    sparse=sparse,
                )
            resolved[quantity] = given
            continue
        match = next((a for a in aliases if a in found), None)
        if match is None:
            lower = {c.lower(): c for c in reversed(found)}
            match = next((lower[a.lower()] for a in aliases if a.lower() in lower), None)
        if match is not None:
            resolved[quantity] = match
    if "loss" not in resolved:
        hint = (
            (
                " ('loss' is there, but most trainers log the training loss under it: if it is the eval loss, "
                "pass --loss-col loss)"
            )
            if any(c.lower() == "loss" for c in found)
            else ""
        )
        raise ColumnNotFound(
            f"{where}: no eval loss column (looked for {', '.join(LOSS_ALIASES)}){hint}; "
            f"{_columns_line(found, sparse)}; map one with --loss-col",
            sparse=sparse,
        )
    if "step" not in resolved and "tokens" not in resolved:
        raise ColumnNotFound(
            f"{where}: no step or tokens column (looked for {', '.join(STEP_ALIASES)}; "
            f"{', '.join(TOKENS_ALIASES)}); {_columns_line(found, sparse)}; map one with --step-col "
            "or --tokens-col",
            sparse=sparse,
        )
    return resolved


def _columns_line(found: list[str], sparse: bool) -> str:
    shown = ", ".join(quoted(c, 60) for c in found[:40]) + (f" ... ({len(found)} in all)" if len(found) > 40 else "")
    return f"{'keys in the rows so far' if sparse else 'columns'}: {shown or 'none'}"


def log_state(
    source: str,
    records: list[Record],
    found: list[str],
    columns: LogColumns = LogColumns(),
    *,
    sparse: bool,
    tokens_per_step: float | None = None,
) -> RunState:
    """The RunState of a log's records (see the module docstring for the rules they must follow)."""
    if not records:
        return RunState(source=source, status="pending", evals=[], kind="log")
    names = resolve_columns(source, found, columns, sparse=sparse)
    step_col, tokens_col, loss_col, time_col = (names.get(k) for k in ("step", "tokens", "loss", "time"))
    order_col = step_col or tokens_col
    evals: list[EvalPoint] = []
    previous: tuple[float, str] | None = None  # (order value, where) of the last row that has one
    last_eval: tuple[float, str] | None = None
    first_time = latest_step = latest_tokens = None
    for record in records:
        step = _step(record, step_col) if step_col else None
        tokens = _number(record, tokens_col, "tokens") if tokens_col else None
        if tokens is None and step is not None and tokens_per_step is not None:
            tokens = step * tokens_per_step
        loss = _number(record, loss_col, "an eval loss")
        if time_col and first_time is None:
            first_time = _time(record, time_col)
        key = step if step_col else tokens
        if key is not None:
            if previous is not None and key < previous[0]:
                raise DelphiError(
                    f"{record.where}: {order_col} = {key:g} after {order_col} = {previous[0]:g} "
                    f"({previous[1]}): the log goes backwards (a resumed run appended to it?); "
                    "one run's log, in step order"
                )
            previous = (key, record.where)
        if step is not None:
            latest_step = step
        if tokens is not None:
            latest_tokens = tokens
        if loss is None:
            continue
        if key is None:
            raise DelphiError(
                f"{record.where}: an eval loss ({loss_col} = {loss:g}) without {' or '.join(filter(None, (step_col, tokens_col)))}"
            )
        if last_eval is not None and key == last_eval[0]:
            raise DelphiError(
                f"{record.where}: a second eval at {order_col} = {key:g} (the first at {last_eval[1]}); "
                "one eval per step"
            )
        last_eval = (key, record.where)
        evals.append(EvalPoint(step, tokens, loss))
    described = dict(names)
    if "tokens" not in names and tokens_per_step is not None:
        described["tokens"] = f"{step_col} x {tokens_per_step:g} tokens per step"
    return RunState(
        source=source,
        status="running",
        evals=evals,
        first_step_time=first_time,
        kind="log",
        n_rows=len(records),
        latest_step=latest_step,
        latest_tokens=latest_tokens,
        columns=described,
    )


def _raw(record: Record, column: str) -> Any:
    return record.values.get(column)


def _number(record: Record, column: str, what: str) -> float | None:
    """A finite number from a record's column; None when the row has none (an empty cell, a missing key)."""
    value = _raw(record, column)
    if value is None:
        return None
    if record.text:
        try:
            number = float(value)
        except ValueError:
            raise DelphiError(f"{record.where}: {column} = {quoted(value, 60)}, expected {what} as a number") from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DelphiError(
            f"{record.where}: {column} = {quoted(value, 60)} ({type(value).__name__}), expected {what} as a number"
        )
    else:
        number = float(value)
    if not math.isfinite(number):
        raise DelphiError(
            f"{record.where}: {column} = {quoted(value, 60)}, expected {what} as a finite number"
            + (" (a diverged run? its log cannot be judged past it)" if what == "an eval loss" else "")
        )
    if what != "an eval loss" and number < 0:
        raise DelphiError(f"{record.where}: {column} = {quoted(value, 60)}, expected {what} >= 0")
    return number


def _step(record: Record, column: str) -> int | None:
    number = _number(record, column, "the step")
    if number is None:
        return None
    if number != int(number):
        raise DelphiError(
            f"{record.where}: {column} = {quoted(_raw(record, column), 60)}, expected a whole step number"
        )
    return int(number)


def _time(record: Record, column: str) -> float | None:
    """Epoch seconds from a number or an ISO 8601 time with a zone; None when the row has none."""
    value = _raw(record, column)
    if value is None:
        return None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return _iso_time(record, column, value)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DelphiError(f"{record.where}: {column} = {quoted(value, 60)}, expected epoch seconds or an ISO 8601 time")
    else:
        number = float(value)
    if not (math.isfinite(number) and MIN_EPOCH_S <= number <= MAX_EPOCH_S):
        raise DelphiError(
            f"{record.where}: {column} = {quoted(value, 60)}, expected wall-clock epoch seconds "
            f"(between {MIN_EPOCH_S:g} and {MAX_EPOCH_S:g}: elapsed seconds or milliseconds are not a time; "
            "map another column with --time-col)"
        )
    return number


def _iso_time(record: Record, column: str, value: str) -> float:
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise DelphiError(
            f"{record.where}: {column} = {quoted(value, 60)}, expected epoch seconds or an ISO 8601 time"
        ) from None
    if moment.tzinfo is None:
        raise DelphiError(
            f"{record.where}: {column} = {quoted(value, 60)} has no time zone; expected an ISO 8601 time "
            "with one (Z or +hh:mm), or epoch seconds"
        )
    return moment.timestamp()


# --------------------------------------------------------------------------- the end of a log


@dataclass(frozen=True)
class RunEnd:
    """What a run must reach to have ended: its tokens and, where known, its steps; and its tokens
    per step, which give a log without a tokens column its tokens."""

    tokens: float | None
    steps: int | None = None
    tokens_per_step: float | None = None

    @classmethod
    def of_hero(cls, hero: dict) -> "RunEnd":
        """The end of a preregistration's `hero` block: its tokens, and its steps and tokens per step
        where it carries its train config (a hero sealed from N and D alone has none)."""
        config = hero.get("config")
        cfg = train_config_from_dict(config, "hero.config") if isinstance(config, dict) else None
        tokens = hero.get("tokens", cfg.tokens if cfg is not None else None)
        return cls(
            None if tokens is None else float(tokens),
            cfg.steps if cfg is not None else None,
            float(cfg.tokens_per_step) if cfg is not None else None,
        )

    def reached_by(self, point: EvalPoint, tolerance_rel: float = TEXT_ROUNDING_REL) -> bool:
        return (
            self.tokens is not None and point.tokens is not None and point.tokens >= self.tokens * (1 - tolerance_rel)
        ) or (self.steps is not None and point.step is not None and point.step >= self.steps)

    def describe(self) -> str:
        parts = [
            f"{self.tokens:.4g} tokens" if self.tokens is not None else None,
            f"step {self.steps}" if self.steps is not None else None,
        ]
        return " or ".join(p for p in parts if p)


def reach_end(run: RunState, end: RunEnd, *, finished: bool = False) -> RunState:
    """A log that has an eval at `end` as a completed run whose final loss is that eval's (the first
    eval to reach it). `finished` declares the log complete: its last eval then ends it if it lies
    within END_TOLERANCE_REL below `end`, and a log that ends further short is a DelphiError (the run
    did not train what was to be judged). Any other source is returned as is: its own status says
    when it ended."""
    if run.kind != "log":
        return run
    at_end = next((e for e in run.evals if end.reached_by(e)), None)
    if at_end is not None:
        return replace(
            run,
            status="completed",
            final_loss=at_end.loss,
            reason=f"the log ends at its eval at {_at(at_end)}: the first to reach {end.describe()}",
        )
    last = run.evals[-1] if run.evals else None
    if finished and last is not None and end.reached_by(last, END_TOLERANCE_REL):
        return replace(
            run,
            status="completed",
            final_loss=last.loss,
            reason=f"declared finished at {_at(last)}, within {END_TOLERANCE_REL:.1%} of {end.describe()}",
        )
    if finished:
        latest = ", ".join(
            p
            for p in (
                f"{run.latest_tokens:.4g} tokens" if run.latest_tokens is not None else None,
                f"step {run.latest_step}" if run.latest_step is not None else None,
            )
            if p
        )
        raise DelphiError(
            f"{run.source}: declared finished (--finished) but its last row is at {latest or 'no step'}"
            + (f", its last eval at {_at(last)}" if last else ", with no eval")
            + f", short of {end.describe()} it was to reach; the run did not train what was sealed"
        )
    return run


def read_to_end(path: str | os.PathLike, end: RunEnd, log: LogOptions = LogOptions()) -> RunState:
    """A run that is to reach `end` (`read_run`): a Delphi run dir as its status says; another trainer's
    log completed once an eval reaches `end` (`reach_end`), its evals' tokens from a column or from the
    step x `end.tokens_per_step` (an eval without tokens is a DelphiError: a trajectory is in tokens)."""
    run = read_run(path, log.columns, tokens_per_step=end.tokens_per_step)
    if run.kind != "log":
        if log.finished:
            raise DelphiError(f"--finished: {run.source} is a Delphi run dir, whose status.json says when it ended")
        return run
    if untimed := next((e for e in run.evals if e.tokens is None), None):
        at = f"step {untimed.step}" if untimed.step is not None else "an eval"
        why = (
            f"its {run.columns['tokens']} is empty at {at}"
            if "tokens" in run.columns
            else f"no tokens column (looked for {', '.join(TOKENS_ALIASES)})"
            + (
                ""
                if end.tokens_per_step
                else " and no tokens per step to count them from the steps (the hero's train config gives them)"
            )
        )
        raise DelphiError(f"{run.source}: {why}; map a column with --tokens-col")
    return reach_end(run, end, finished=log.finished)


def _at(point: EvalPoint) -> str:
    return ", ".join(
        p
        for p in (
            f"{point.tokens:.4g} tokens" if point.tokens is not None else None,
            f"step {point.step}" if point.step is not None else None,
        )
        if p
    )


# --------------------------------------------------------------------------- W&B


# W&B run states -> run dir statuses.
WANDB_STATES = {
    "running": "running",
    "finished": "completed",
    "crashed": "failed",
    "failed": "failed",
    "killed": "failed",
    "pending": "pending",
}


def read_wandb(path: str, columns: LogColumns = LogColumns()) -> RunState:
    """A run through the W&B public API: ENTITY/PROJECT/RUN; offline -> DelphiError (exit 2). Its
    history is read as a log (`log_state`); its state and summary say when it ended."""
    if path.count("/") != 2 or not all(path.split("/")):
        raise DelphiError(f"--wandb {path}: expected ENTITY/PROJECT/RUN")
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        raise DelphiError(f"--wandb {path}: W&B is offline (WANDB_MODE={os.environ['WANDB_MODE']}); use --run RUN_DIR")
    try:
        import wandb

        api = wandb.Api(timeout=15)
        run = api.run(path)
        rows = [dict(r) for r in run.scan_history(keys=None)]
        state = WANDB_STATES.get(run.state, "unknown")
        summary = dict(run.summary)
        created = _utc_epoch(str(run.created_at)) if run.created_at else None
    except DelphiError:
        raise
    except Exception as e:  # no network, no API key, no such run: all bad input here
        raise DelphiError(
            f"--wandb {path}: cannot read the run from W&B ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); offline? use --run RUN_DIR"
        ) from None
    rows = sorted(
        (r for r in rows if r.get("step", r.get("_step")) is not None), key=lambda r: r.get("step", r.get("_step"))
    )
    records = [
        Record(f"wandb:{path}: row {i}", {k: v for k, v in r.items() if v is not None}, text=False)
        for i, r in enumerate(rows, start=1)
    ]
    found: dict[str, None] = {}
    for record in records:
        found.update(dict.fromkeys(record.values))
    state_ = log_state(f"wandb:{path}", records, list(found), columns, sparse=True)
    final = summary.get("val_loss") if state == "completed" else None
    return replace(
        state_,
        status=state,
        kind="wandb",
        first_step_time=created,
        final_loss=final,
        final_bpb=summary.get("val_bpb") if state == "completed" else None,
    )


def _utc_epoch(text: str) -> float:
    """Epoch seconds of a W&B time (ISO 8601 in UTC, written with or without its zone)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()
