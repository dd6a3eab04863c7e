"""`delphi paper build|snapshot`: the project's own write-up (delphi.paper) and compact copies of a
study (delphi.study.snapshot)."""

from __future__ import annotations

import argparse
import sys


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    add_paper_commands(subparsers)


def add_paper_commands(subparsers: argparse._SubParsersAction) -> None:
    from delphi.cli import add_json_flag

    paper = subparsers.add_parser("paper", help="the project's own write-up (paper/)")
    sub = paper.add_subparsers(dest="paper_command", metavar="ACTION")
    build = sub.add_parser("build", help="redraw every figure and re-render PAPER_DIR/paper.md from a finished study's data")
    build.add_argument("--paper-dir", default="paper", help="paper directory: template.md in, paper.md and figures/ out (default: paper)")
    build.add_argument("--data", metavar="DIR", help="a finished study's compact copy (e.g. paper/v3/study; default: PAPER_DIR/data)")
    build.add_argument("--from-study", metavar="STUDY_DIR", help="first import a finished study's data into PAPER_DIR/data")
    add_json_flag(build)
    build.set_defaults(func=_paper_build)
    snap = sub.add_parser("snapshot", help="copy a study in progress, compactly, to commit a completed stage")
    snap.add_argument("--from-study", required=True, metavar="STUDY_DIR")
    snap.add_argument("--to", required=True, metavar="DIR",
                      help="where the compact copy goes (to continue elsewhere: copy it to a study dir, rerun the study)")
    snap.add_argument("--resumable", action="store_true",
                      help="keep unfinished runs too, each with its newest checkpoint, so that they resume there "
                           "(a hero longer than one working session)")
    add_json_flag(snap)
    snap.set_defaults(func=_paper_snapshot)


def _paper_snapshot(args: argparse.Namespace) -> dict:
    from delphi.study import export_study

    copied = export_study(args.from_study, args.to, resumable=args.resumable)
    runs = sorted({p.split("/")[2] for p in copied if p.startswith("ladder/runs/")})
    print(f"snapshot: {len(copied)} files, {len(runs)} finished ladder runs, into {args.to}", file=sys.stderr)
    return {"files": len(copied), "ladder_runs": runs, "to": args.to}


def _paper_build(args: argparse.Namespace) -> dict:
    from delphi.paper import build_paper

    return build_paper(args.paper_dir, args.from_study, args.data)
