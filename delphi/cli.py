"""The `delphi` command: a thin layer over library functions.

Each part of the loop registers its own subcommands (`delphi/<part>/commands.py`
exposes `add_commands(subparsers)`), so this file only wires them together and
owns the exit-code contract of docs/design.md §3.1:

    0    success
    1    the checked thing failed (a prediction missed, a seal broke)
    2    bad input or usage (a `DelphiError`), nothing written; also a write or read the
         system refused (a full disk, a name too long: `delphi.errors.SYSTEM_ERRNOS`), one line naming the file
    130  Ctrl-C
    141  stdout or stderr was closed by its reader (`delphi ... --json | head -c5`): quietly,
         as a writer killed by SIGPIPE (128 + 13)

A handler takes the parsed arguments and returns a JSON-able dict (exit 0) or
a `(dict, exit_code)` pair. With `--json` the dict is printed on stdout as one
object; human-readable text always goes to stderr. A `CheckFailed` (exit 1) prints
one too: `ok: false`, `failed` (its message) and whatever result it carries.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from delphi import __version__
from delphi.errors import SYSTEM_ERRNOS, CheckFailed, DelphiError, message_line, system_error_line
from delphi.train.config import DEVICE_CHOICES
from delphi.train.environment import DEVICE_ENV
from delphi.train.runlog import LogColumns

# Subpackages that contribute subcommands, in the order they appear in --help.
COMMAND_MODULES = (
    "delphi.data.commands",
    "delphi.train.commands",
    "delphi.experiments.commands",
    "delphi.ladder.commands",
    "delphi.fits.commands",
    "delphi.prereg.commands",
    "delphi.plot.commands",
    "delphi.study.commands",
    "delphi.paper.commands",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default exit code is already 2
        self.print_usage(sys.stderr)
        self.exit(2, f"delphi: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="delphi", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"delphi {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(subparsers)
    _groups_print_their_own_help(parser)
    return parser


def _groups_print_their_own_help(parser: argparse.ArgumentParser) -> None:
    """`delphi mup` (a group given no subcommand) prints the group's help and exits 2."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for child in action.choices.values():
            if any(isinstance(a, argparse._SubParsersAction) for a in child._actions):
                if child.get_default("func") is None:
                    child.set_defaults(func=_print_help_of(child))
                _groups_print_their_own_help(child)


def _print_help_of(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], tuple[None, int]]:
    def print_help(args: argparse.Namespace) -> tuple[None, int]:
        parser.print_help(sys.stderr)
        return None, 2

    return print_help


def positive_float(text: str) -> float:
    """argparse type of a FLOP count, token count, tolerance...: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def output_path(text: str) -> str:
    """argparse type of an --out path: Path("") would silently mean the current directory. The text
    is kept as given (not a Path, which drops a trailing separator): `--out newdir/` names a
    directory, and the output policy refuses it where a file is expected (delphi.path_policy)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path; expected a file or directory name")
    return text


def positive_int(text: str) -> int:
    """argparse type of a count (workers, steps, seeds): an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type of a count that may be zero (retries, bootstrap replicates)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


# Columns of a results table that a command maps by flag (--params-col ...: delphi.fits.data.load_results),
# spelled out so that building the parser (every `delphi --help`) does not import pandas.
COLUMN_OPTIONS = ("params", "tokens", "flops", "loss", "budget", "run_id", "experts", "granularity")
# delphi.fits.allocation.PARAM_CONVENTIONS, likewise; tests/test_cli_help.py checks they agree.
PARAM_CONVENTIONS = ("nonembedding", "active", "fpt6")
# Quantities of a run's metrics log that a command maps by flag (--step-col ...: delphi.train.runlog).
LOG_COLUMNS = ("step", "tokens", "loss", "time")


def add_column_options(parser: argparse.ArgumentParser) -> None:
    """How a results table is read: the column mapping, the row query and what to drop (`table_options`)."""
    for name in COLUMN_OPTIONS:
        parser.add_argument(
            f"--{name.replace('_', '-')}-col",
            dest=f"{name}_col",
            metavar="COL",
            help=f"the table's column holding {name}",
        )
    parser.add_argument(
        "--query",
        metavar="EXPR",
        help="select rows: columns, numbers, 'strings', == != < <= > >=, and/or/not, in [...], "
        "parentheses (never evaluated as Python), e.g. \"source == 'llama_3' and not outlier\"",
    )
    parser.add_argument(
        "--drop-invalid",
        action="store_true",
        help="drop rows with a non-finite or non-positive value (named on stderr) instead of failing",
    )
    parser.add_argument(
        "--drop-duplicates",
        action="store_true",
        help="drop rows that repeat an earlier row exactly (named on stderr) instead of failing; "
        "a run_id on two different rows stays an error",
    )


def add_table_options(parser: argparse.ArgumentParser) -> None:
    """`add_column_options` plus how N is counted and the FLOPs family: the flags of every command that
    fits or draws a results table (`table_load_kwargs`)."""
    add_column_options(parser)
    parser.add_argument(
        "--params-convention",
        choices=PARAM_CONVENTIONS,
        default="nonembedding",
        help="how N is counted in a ladder table: active non-embedding (default), active incl. "
        "embeddings, or flops_per_token/6 (external tables keep their params column)",
    )
    parser.add_argument(
        "--family",
        type=Path,
        metavar="FAMILY.json",
        help="exact FLOPs per token of the model family (delphi ladder family); default "
        "<results>.family.json if present, else a ladder table's own shapes, else 6ND",
    )


def table_options(args: argparse.Namespace):
    """The `add_column_options` flags as a delphi.fits.data.TableOptions."""
    from delphi.fits.data import TableOptions  # lazy: delphi.fits.data imports pandas

    columns = tuple(
        (name, getattr(args, f"{name}_col")) for name in COLUMN_OPTIONS if getattr(args, f"{name}_col", None)
    )
    return TableOptions(
        columns=columns, query=args.query, drop_invalid=args.drop_invalid, drop_duplicates=args.drop_duplicates
    )


def table_load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`load_results`' keyword arguments from the flags `add_table_options` added: the TableOptions,
    how N is counted, the FLOPs family and warnings to stderr."""
    return {
        "options": table_options(args),
        "params_convention": args.params_convention,
        "family": args.family,
        "warn": lambda line: print(line, file=sys.stderr),
    }


def add_log_options(parser: argparse.ArgumentParser, *, flag_prefix: str = "") -> None:
    """The column flags of every command that reads a run's metrics log (delphi.train.runlog).
    `flag_prefix` ("log-": --log-loss-col) names them apart from a results table's in a command
    that reads both."""
    for name in LOG_COLUMNS:
        parser.add_argument(
            f"--{flag_prefix}{name}-col",
            dest=f"log_{name}_col",
            metavar="COL",
            help=f"the log's column holding the {'eval loss' if name == 'loss' else name} "
            "(another trainer's log; default: the first of its usual names, docs/cli.md)",
        )


def log_columns(args: argparse.Namespace):
    """The `delphi.train.runlog.LogColumns` the flags of `add_log_options` give."""
    return LogColumns(**{name: getattr(args, f"log_{name}_col", None) for name in LOG_COLUMNS})


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def add_device_flag(parser: argparse.ArgumentParser) -> None:
    """`--device auto|cpu|gpu` of a command that trains (delphi.train.device)."""
    parser.add_argument(
        "--device",
        choices=DEVICE_CHOICES,
        default=None,
        help="train on the CPU, on a GPU (exit 2 if JAX sees none), or on what JAX finds (auto); "
        "default: each config's `device` (auto). Every run this command starts follows it",
    )


@contextlib.contextmanager
def _device_from_flag(args: argparse.Namespace) -> Iterator[None]:
    """--device as DELPHI_DEVICE while the command runs, so that the processes it starts (ladder
    workers) inherit it; the environment as it was afterwards."""
    device = getattr(args, "device", None)
    if device is None:
        yield
        return

    saved = os.environ.get(DEVICE_ENV)
    os.environ[DEVICE_ENV] = device
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(DEVICE_ENV, None)
        else:
            os.environ[DEVICE_ENV] = saved


def emit(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if getattr(args, "json", False):
        json.dump(result, sys.stdout, default=_plain)
        sys.stdout.write("\n")
        sys.stdout.flush()


def _plain(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


EXIT_PIPE_CLOSED = 128 + 13  # SIGPIPE, as `yes | head` reports it


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command started (building the parser): still 130
        print("delphi: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _pipe_closed()


def _pipe_closed() -> int:
    """The reader of stdout (or stderr) went away (`| head -c5`, `| true`): stop quietly, as any
    writer into `head` does. Python's recommended pattern: point stdout at /dev/null, so that the
    flush at exit does not fail again and print "Exception ignored"."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (a test's capture): nothing to redirect
        pass
    return EXIT_PIPE_CLOSED


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], Any] | None = getattr(args, "func", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        with _device_from_flag(args):
            outcome = handler(args)
    except DelphiError as e:
        print(f"delphi: error: {message_line(e)}", file=sys.stderr)
        return 2
    except CheckFailed as e:
        print(f"delphi: failed: {message_line(e)}", file=sys.stderr)
        emit(args, {"ok": False, "failed": message_line(e)} | (e.result or {}))  # exit 1 has a result too
        return 1
    except KeyboardInterrupt:
        print("delphi: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if isinstance(e, BrokenPipeError) or e.errno not in SYSTEM_ERRNOS:
            raise
        print(f"delphi: error: {system_error_line(e)}", file=sys.stderr)
        return 2
    result, code = outcome if isinstance(outcome, tuple) else (outcome, 0)
    if result is not None:
        emit(args, result)
    return code


if __name__ == "__main__":
    sys.exit(main())
