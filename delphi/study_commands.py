"""`delphi study [STUDY.yaml] --out DIR`: the whole loop (delphi.study)."""

from __future__ import annotations

import argparse


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    from delphi.cli import add_json_flag

    sub = subparsers.add_parser("study", help="run (or resume) a whole study: ladder, fits, preregistration, hero, report")
    sub.add_argument("study", nargs="?", help="study YAML (default: the built-in CPU study, ~15 min on 2 cores)")
    sub.add_argument("--out", default="runs/study", help="study directory (default: runs/study)")
    add_json_flag(sub)
    sub.set_defaults(func=_study)


def _study(args: argparse.Namespace):
    from delphi.study import run_study

    result = run_study(args.study, args.out)
    return result, 0 if result["verdict"] in ("passed", "on-track") else 1
