"""`delphi study [STUDY.yaml] --out DIR`: the whole loop (delphi.study)."""

from __future__ import annotations

import argparse
import sys


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    from delphi.cli import add_json_flag

    sub = subparsers.add_parser("study", help="run (or resume) a whole study: ladder, fits, preregistration, hero, report")
    sub.add_argument("study", nargs="?", help="study YAML (default: the built-in CPU study, ~16-20 min on 2 cores)")
    sub.add_argument("--out", default="runs/study", help="study directory (default: runs/study)")
    sub.add_argument("--stop-after", metavar="STAGE", help="stop after this stage (e.g. prereg, to commit the sealed file first)")
    sub.add_argument("--accept-store", metavar="SHA256",
                     help="go on with the corpus store of this sha256 though the study's rungs trained on another "
                          "(a study continued on a machine whose installed packages differ; recorded in the study dir)")
    sub.add_argument("--force", action="store_true",
                     help="write into a non-empty --out that is not a study directory (no study.json)")
    add_json_flag(sub)
    sub.set_defaults(func=_study)
    add_paper_commands(subparsers)


def _study(args: argparse.Namespace):
    from delphi.io import check_output_dir, check_owned_dir
    from delphi.study import STUDY_FILE, run_study

    check_output_dir(args.out, inputs=(args.study,))
    check_owned_dir(args.out, (STUDY_FILE,), "study", force=args.force)  # a study resumes in its own dir
    result = run_study(args.study, args.out, stop_after=args.stop_after, accept_store=args.accept_store)
    if result.get("stopped_after"):
        return result, 0
    return result, 0 if result["verdict"] == "passed" else 1


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
    snap.add_argument("--force", action="store_true",
                      help="copy into a non-empty --to that is not a study snapshot (no study.json)")
    add_json_flag(snap)
    snap.set_defaults(func=_paper_snapshot)


def _paper_snapshot(args: argparse.Namespace) -> dict:
    from delphi.io import check_output_dir, check_owned_dir
    from delphi.study import STUDY_FILE, export_study

    check_output_dir(args.to, inputs=(args.from_study,), flag="--to")
    check_owned_dir(args.to, (STUDY_FILE,), "paper snapshot", force=args.force, flag="--to")
    copied = export_study(args.from_study, args.to, resumable=args.resumable)
    runs = sorted({p.split("/")[2] for p in copied if p.startswith("ladder/runs/")})
    print(f"snapshot: {len(copied)} files, {len(runs)} finished ladder runs, into {args.to}", file=sys.stderr)
    return {"files": len(copied), "ladder_runs": runs, "to": args.to}


def _paper_build(args: argparse.Namespace) -> dict:
    from delphi.paper import build_paper

    return build_paper(args.paper_dir, args.from_study, args.data)
