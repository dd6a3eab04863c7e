"""`delphi paper ...`: build the paper's editions, snapshot a study compactly, unpack and verify editions."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from delphi.cli import add_json_flag
from delphi.compact import unpack
from delphi.editions import built_editions
from delphi.errors import DelphiError
from delphi.path_policy import check_output_dir, check_owned_dir


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    paper = subparsers.add_parser("paper", help="the project's own write-up (paper/)")
    sub = paper.add_subparsers(dest="paper_command", metavar="ACTION")
    build = sub.add_parser(
        "build", help="redraw every figure and re-render an edition's paper.md from its compact data"
    )
    build.add_argument(
        "--paper-dir",
        default="paper",
        help="paper directory: template.md in, paper.md and figures/ out (default: paper)",
    )
    build.add_argument(
        "--data",
        metavar="DIR",
        help="a finished study's copy (e.g. paper/editions/v3/study; default: PAPER_DIR/data, "
        "else the newest edition's study)",
    )
    build.add_argument(
        "--from-study", metavar="STUDY_DIR", help="first import a finished study's data into PAPER_DIR/data"
    )
    which = build.add_mutually_exclusive_group()
    which.add_argument(
        "--edition",
        metavar="vN",
        help="render one edition from its data in PAPER_DIR/editions/vN (the newest renders into PAPER_DIR/paper.md)",
    )
    which.add_argument("--all", action="store_true", help="render every edition that has a template")
    add_json_flag(build)
    build.set_defaults(func=_build)
    snap = sub.add_parser(
        "snapshot", help="copy a study in progress, compactly (curves and files tables), to commit a completed stage"
    )
    snap.add_argument("--from-study", required=True, metavar="STUDY_DIR")
    snap.add_argument(
        "--to",
        required=True,
        metavar="DIR",
        help="where the compact copy goes (to continue elsewhere: `delphi paper unpack DIR --to STUDY_DIR`, rerun the study)",
    )
    snap.add_argument(
        "--resumable",
        action="store_true",
        help="keep unfinished runs too, each with its newest checkpoint, so that they resume there "
        "(a hero longer than one working session)",
    )
    snap.add_argument(
        "--force", action="store_true", help="copy into a non-empty --to that is not a study snapshot (no study.json)"
    )
    add_json_flag(snap)
    snap.set_defaults(func=_snapshot)
    unpack = sub.add_parser(
        "unpack", help="write a compact edition or snapshot back as directories (run dirs with metrics.jsonl)"
    )
    unpack.add_argument(
        "compact", metavar="DIR", help="a compact edition or snapshot (holds curves.csv.gz and files.csv.gz)"
    )
    unpack.add_argument("--to", required=True, metavar="DIR", help="an empty or new directory")
    add_json_flag(unpack)
    unpack.set_defaults(func=_unpack)
    verify = sub.add_parser(
        "verify",
        help="every sealed preregistration against the editions' compact data: seal, "
        "recorded sha256s, and `prereg verify --run` on its hero",
    )
    verify.add_argument("--paper-root", default="paper")
    verify.add_argument("--preregistrations", default="preregistrations")
    add_json_flag(verify)
    verify.set_defaults(func=_verify)


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def _build(args: argparse.Namespace):
    from delphi.paper.build import build_edition, build_paper  # lazy: imports pandas, jax and matplotlib

    if args.edition or args.all:
        if args.data or args.from_study:
            raise DelphiError(
                "paper build: --edition/--all take their data from the edition; not with --data or --from-study"
            )
        names = list(built_editions(args.paper_dir)) if args.all else [args.edition]
        built = [build_edition(name, args.paper_dir) for name in names]
        for b in built:
            _say(f"{b['edition']}: {b['paper']} from {b['data']}")
        return {"editions": built}
    return build_paper(args.paper_dir, args.from_study, args.data)


def _snapshot(args: argparse.Namespace) -> dict:
    from delphi.paper.study_import import snapshot  # lazy: imports the study pipeline (jax)
    from delphi.study.state import STUDY_FILE  # lazy: imports the study pipeline (jax)

    check_output_dir(args.to, inputs=(args.from_study,), flag="--to")
    check_owned_dir(args.to, (STUDY_FILE,), "paper snapshot", force=args.force, flag="--to")
    result = snapshot(args.from_study, args.to, resumable=args.resumable)
    _say(
        f"snapshot: {result['files']} files, {len(result['ladder_runs'])} finished ladder runs, into {args.to} "
        f"({result['compact']['runs']} runs' curves in curves.csv.gz)"
    )
    return result


def _unpack(args: argparse.Namespace) -> dict:
    dest = Path(args.to)
    if dest.exists() and any(dest.iterdir()):
        raise DelphiError(f"--to {dest}: not empty; unpack into a new directory")
    unpack(args.compact, dest)
    files = sum(1 for p in dest.rglob("*") if p.is_file())
    _say(f"unpacked {args.compact} into {dest} ({files} files)")
    return {"to": str(dest), "files": files}


def _verify(args: argparse.Namespace):
    from delphi.paper.verify import verify_editions  # lazy: imports prereg.check (pandas, scipy)

    rows = verify_editions(args.paper_root, args.preregistrations)
    for r in rows:
        _say(
            f"{r['file']}: seal {'ok' if r['seal_ok'] else 'BROKEN'}; {r['hashes']} recorded sha256s all found in "
            f"{', '.join(r['editions_holding_all']) or 'NO edition'}; "
            + (
                f"--run {r['run']}: {'created before the run started' if r['run_ok'] else 'FAILED'}"
                if r["run"]
                else "pending: no outcome yet, its runs not in an edition"
                if r["pending"]
                else "no hero run found"
            )
        )
        for problem in r["problems"]:
            _say(f"  problem: {problem}")
        for warning in r.get("warnings", []):
            _say(f"  note: {warning}")
    ok = all(
        r["seal_ok"] and not r["problems"] and (r["pending"] or (r["editions_holding_all"] and r["run_ok"]))
        for r in rows
    )
    return {"preregistrations": rows, "ok": ok}, 0 if ok else 1
