"""`delphi study [STUDY.yaml] --out DIR`: the whole loop (delphi.study)."""

from __future__ import annotations

import argparse


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    from delphi.cli import add_device_flag, add_json_flag

    sub = subparsers.add_parser("study", help="run (or resume) a whole study: ladder, fits, preregistration, hero, report")
    sub.add_argument("study", nargs="?", help="study YAML (default: the built-in CPU study, ~8-11 min on 2 cores)")
    sub.add_argument("--out", default="runs/study", help="study directory (default: runs/study)")
    sub.add_argument("--stop-after", metavar="STAGE", help="stop after this stage (e.g. seals or prereg, to commit the sealed files first)")
    sub.add_argument("--accept-store", metavar="SHA256",
                     help="go on with the corpus store of this sha256 though the study's rungs trained on another "
                          "(a study continued on a machine whose installed packages differ; recorded in the study dir)")
    sub.add_argument("--force", action="store_true",
                     help="write into a non-empty --out that is not a study directory (no study.json)")
    add_device_flag(sub)
    add_json_flag(sub)
    sub.set_defaults(func=_study)


def _study(args: argparse.Namespace):
    from delphi.io import check_output_dir, check_owned_dir
    from delphi.study import STUDY_FILE, run_study

    check_output_dir(args.out, inputs=(args.study,))
    check_owned_dir(args.out, (STUDY_FILE,), "study", force=args.force)  # a study resumes in its own dir
    result = run_study(args.study, args.out, stop_after=args.stop_after, accept_store=args.accept_store)
    if result.get("stopped_after"):
        return result, 0
    return result, 0 if result["verdict"] == "passed" else 1
