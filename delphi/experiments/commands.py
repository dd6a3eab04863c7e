"""CLI: `delphi mup coord-check` and `delphi mup lr-sweep` (delphi.experiments)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from delphi.cli import add_json_flag, nonnegative_int, output_path, positive_float, positive_int
from delphi.errors import DelphiError, quoted
from delphi.experiments.lrsweep_spec import DEFAULT_LRS, DEFAULT_STEPS, DEFAULT_WIDTHS, LRSweepSpec
from delphi.path_policy import check_output_dir, check_replaceable


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    mup = subparsers.add_parser("mup", help="muP verification")
    mup_sub = mup.add_subparsers(dest="mup_command", metavar="MUP_COMMAND", parser_class=type(mup))
    cc = mup_sub.add_parser(
        "coord-check", help="activation magnitudes vs width over the first Adam steps (muP must pass, SP must fail)"
    )
    cc.add_argument("--out", type=output_path, required=True, help="directory for coordcheck.json and coordcheck.png")
    cc.add_argument("--param", choices=("mup", "sp", "both"), default="both", help="parameterisation(s) to check")
    cc.add_argument("--ffn", choices=("dense", "moe", "both"), default="both")
    cc.add_argument(
        "--widths", default="32,64,128,256,512", help="comma-separated d_model values; the first is the base"
    )
    cc.add_argument("--seeds", type=positive_int, default=4)
    cc.add_argument("--steps", type=positive_int, default=10)
    cc.add_argument("--lr", type=positive_float, default=None, help="base Adam LR (default: the spec's)")
    cc.add_argument("--layers", type=positive_int, default=1)
    cc.add_argument("--seq-len", type=positive_int, default=16)
    cc.add_argument("--batch-size", type=positive_int, default=8)
    cc.add_argument(
        "--force",
        action="store_true",
        help="replace coordcheck.json/.png in --out even if this command did not write them",
    )
    add_json_flag(cc)
    cc.set_defaults(func=cmd_coord_check)

    sub = mup_sub.add_parser(
        "lr-sweep", help="final loss vs base LR at several widths under muP; how far the optimum moves"
    )
    sub.add_argument(
        "--out", type=output_path, required=True, help="directory for runs/, sweep.csv, sweep.json, sweep.png"
    )
    sub.add_argument(
        "--widths",
        default=",".join(map(str, DEFAULT_WIDTHS)),
        help="comma-separated d_model; the first is the muP base",
    )
    sub.add_argument("--lrs", default=",".join(f"{lr:g}" for lr in DEFAULT_LRS), help="comma-separated base Adam LRs")
    sub.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    sub.add_argument("--ffn", choices=("dense", "moe"), default="dense")
    sub.add_argument("--layers", type=int, default=LRSweepSpec.n_layers)
    sub.add_argument("--batch-size", type=int, default=LRSweepSpec.batch_size)
    sub.add_argument("--seq-len", type=int, default=LRSweepSpec.seq_len)
    sub.add_argument("--eval-tokens", type=int, default=LRSweepSpec.eval_tokens)
    sub.add_argument("--store", default=LRSweepSpec.store, help="token store: a built-in name or a prepared directory")
    sub.add_argument("--seed", type=nonnegative_int, default=0)
    sub.add_argument(
        "--force",
        action="store_true",
        help="replace sweep.csv/.json/.png/.svg in --out even if this command did not write them",
    )
    add_json_flag(sub)
    sub.set_defaults(func=cmd_lr_sweep)


def _parse_list(text: str, kind: type, flag: str) -> tuple:
    try:
        return tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise DelphiError(
            f"{flag}: expected comma-separated {'integers' if kind is int else 'numbers'}, got {quoted(text)}"
        ) from None


def _check_replaceable_in(out: str, names: tuple[str, ...], command: str, force: bool) -> None:
    for name in names:
        check_replaceable(Path(out) / name, command, force=force)


def cmd_coord_check(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    from delphi.experiments.coordcheck import (  # lazy: imports JAX (seconds)
        CoordCheckSpec,
        coord_check,
        expected_outcome,
        save_report,
    )

    widths = _parse_list(args.widths, int, "--widths")
    if len(widths) < 2 or any(w <= 0 for w in widths) or list(widths) != sorted(set(widths)):
        raise DelphiError(f"--widths: need at least two increasing positive widths, got {quoted(args.widths)}")
    for name in ("seeds", "steps", "layers", "seq_len", "batch_size"):
        if getattr(args, name) <= 0:
            raise DelphiError(f"--{name.replace('_', '-')}: must be a positive integer, got {getattr(args, name)}")
    if args.lr is not None and args.lr <= 0:
        raise DelphiError(f"--lr: must be positive, got {args.lr}")

    check_output_dir(args.out)
    _check_replaceable_in(args.out, ("coordcheck.json", "coordcheck.png"), "mup coord-check", args.force)

    params = {"mup": [True], "sp": [False], "both": [True, False]}[args.param]
    ffns = {"dense": [False], "moe": [True], "both": [False, True]}[args.ffn]
    extra = {"lr": args.lr} if args.lr is not None else {}
    specs = [
        CoordCheckSpec(
            widths=widths,
            mup=m,
            moe=moe,
            seeds=tuple(range(args.seeds)),
            steps=args.steps,
            n_layers=args.layers,
            seq_len=args.seq_len,
            batch_size=args.batch_size,
            **extra,
        )
        for moe in ffns
        for m in params
    ]
    for spec in specs:  # validates every shape (e.g. a width the head size does not divide) before running
        for w in widths:
            spec.model_config(w)

    results = []
    for spec in specs:
        result = coord_check(spec)
        print(result.summary(), file=sys.stderr)
        results.append(result)
    passed = all(expected_outcome(r) for r in results)
    report = save_report(results, args.out, passed=passed, written_by="mup coord-check")
    verdict = "muP passes and SP fails as expected" if report["passed"] else "unexpected outcome (see above)"
    print(f"coord-check: {verdict}; wrote {report['json']} and {report['plot']}", file=sys.stderr)
    return report, 0 if report["passed"] else 1


def cmd_lr_sweep(args: argparse.Namespace) -> dict[str, Any]:
    from delphi.experiments.lrsweep import run_sweep, save_report  # lazy: imports JAX (seconds)

    check_output_dir(args.out)
    _check_replaceable_in(args.out, ("sweep.csv", "sweep.json", "sweep.png", "sweep.svg"), "mup lr-sweep", args.force)
    spec = LRSweepSpec(
        widths=_parse_list(args.widths, int, "--widths"),
        lrs=tuple(sorted(_parse_list(args.lrs, float, "--lrs"))),
        steps=args.steps,
        ffn=args.ffn,
        n_layers=args.layers,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        eval_tokens=args.eval_tokens,
        store=args.store,
        seed=args.seed,
    ).validate()
    result = run_sweep(spec, args.out)
    report = save_report(result, args.out, written_by="mup lr-sweep")
    print(result.summary(), file=sys.stderr)
    print(f"lr-sweep: wrote {report['csv']}, {report['json']} and {report['plots'][0]}", file=sys.stderr)
    return report
