"""`delphi study [STUDY.yaml] --out DIR`: the whole loop (delphi.study); `delphi report`: its report
for a pipeline assembled by hand (delphi.study.pipeline_report)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from delphi.cli import (
    add_device_flag,
    add_json_flag,
    add_log_options,
    add_table_options,
    log_columns,
    table_load_kwargs,
)
from delphi.errors import DelphiError
from delphi.path_policy import check_output_dir, check_output_file, check_owned_dir
from delphi.train.runlog import LogOptions


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    sub = subparsers.add_parser(
        "study", help="run (or resume) a whole study: ladder, fits, preregistration, hero, report"
    )
    sub.add_argument("study", nargs="?", help="study YAML (default: the built-in CPU study, ~8-11 min on 2 cores)")
    sub.add_argument("--out", default="runs/study", help="study directory (default: runs/study)")
    sub.add_argument(
        "--stop-after",
        metavar="STAGE",
        help="stop after this stage (e.g. seals or prereg, to commit the sealed files first)",
    )
    sub.add_argument(
        "--accept-store",
        metavar="SHA256",
        help="go on with the corpus store of this sha256 though the study's rungs trained on another "
        "(a study continued on a machine whose installed packages differ; recorded in the study dir)",
    )
    sub.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty --out that is not a study directory (no study.json)",
    )
    add_device_flag(sub)
    add_json_flag(sub)
    sub.set_defaults(func=_study)

    rep = subparsers.add_parser(
        "report",
        help="report.md and figures for a pipeline assembled by hand: a results table, "
        "a fit, a seal, a run's log (each optional)",
    )
    rep.add_argument("--results", help="results table (CSV, JSON, JSONL or Parquet), read as `delphi fit` reads it")
    add_table_options(rep)
    rep.add_argument("--fit", help="FIT.json written by `delphi fit`")
    rep.add_argument(
        "--prereg", help="the sealed preregistration (its gate report NAME.gates.json beside it is read too)"
    )
    rep.add_argument(
        "--run",
        action="append",
        help="the hero's run, judged against --prereg: a Delphi run dir, another trainer's metrics log or a "
        "directory holding one; a multi-seed seal: one --run per sealed seed",
    )
    add_log_options(rep, flag_prefix="log-")
    rep.add_argument(
        "--finished", action="store_true", help="the run's log is complete: judge it now (as prereg check)"
    )
    rep.add_argument("--out", required=True, help="directory for report.md and figures/")
    rep.add_argument(
        "--force", action="store_true", help="replace report.md and figures that `delphi report` did not write"
    )
    add_json_flag(rep)
    rep.set_defaults(func=_report)


def _study(args: argparse.Namespace):
    from delphi.study.stages import run_study  # lazy: jax (the trainer)
    from delphi.study.state import STUDY_FILE  # lazy: pandas

    check_output_dir(args.out, inputs=(args.study,))
    check_owned_dir(args.out, (STUDY_FILE,), "study", force=args.force)  # a study resumes in its own dir
    result = run_study(args.study, args.out, stop_after=args.stop_after, accept_store=args.accept_store)
    if result.get("stopped_after"):
        return result, 0
    return result, 0 if result["verdict"] == "passed" else 1


def _report(args: argparse.Namespace):
    from delphi.study.pipeline_report import (  # lazy: pandas
        PIPELINE_FIGURES,
        REPORT_COMMAND,
        PipelineInputs,
        pipeline_report,
    )

    if not (args.results or args.fit or args.prereg):
        raise DelphiError("delphi report: give at least one of --results, --fit, --prereg (and --run with --prereg)")
    inputs = (args.results, args.fit, args.prereg, *(args.run or ()))
    out = check_output_dir(args.out, inputs=inputs)
    for path in [
        out / "report.md",
        *(out / "figures" / f"{name}{ext}" for name in PIPELINE_FIGURES for ext in (".png", ".svg")),
    ]:
        check_output_file(path, inputs=inputs, command=REPORT_COMMAND, force=args.force)
    pipeline = PipelineInputs(
        results=Path(args.results) if args.results else None,
        table_options=table_load_kwargs(args) if args.results else {},
        fit=Path(args.fit) if args.fit else None,
        prereg=Path(args.prereg) if args.prereg else None,
        runs=tuple(Path(r) for r in args.run or ()),
        log=LogOptions(log_columns(args), finished=args.finished),
    )
    result = pipeline_report(pipeline, out)
    verdict = (result.get("check") or {}).get("verdict")
    print(
        f"wrote {result['report']} and {len(result['figures'])} figures" + (f"; verdict {verdict}" if verdict else ""),
        file=sys.stderr,
    )
    return result
