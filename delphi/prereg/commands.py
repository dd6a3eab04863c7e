"""`delphi prereg create|verify|check|index|curves`.

Exit codes: 0 ok / on-track / passed / not-started; 1 seal broken, created after
the run started, deviating or failed; 2 bad input (nothing written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from delphi.cli import (
    add_column_options,
    add_json_flag,
    add_log_options,
    log_columns,
    nonnegative_int,
    positive_float,
    table_options,
)
from delphi.editions import resolve_data
from delphi.errors import CheckFailed, DelphiError
from delphi.io import atomic_write_json, read_json
from delphi.path_policy import check_output_file
from delphi.train.runlog import LogOptions

# delphi.fits.probes.PROBE_CARRIES and NOISE_SCOPES, spelled out so that building the parser does
# not import pandas (tests/test_cli_help.py checks they agree).
PROBE_CARRIES = ("linear", "local_slope")
NOISE_SCOPES = ("pooled", "top_budget")


def add_commands(subparsers) -> None:
    prereg = subparsers.add_parser(
        "prereg", help="preregister a hero run's loss, verify the seal, check a run against it"
    )
    sub = prereg.add_subparsers(dest="prereg_command", metavar="SUBCOMMAND")

    p = sub.add_parser("create", help="write a sealed preregistration (refuses to overwrite)")
    p.add_argument(
        "--fit", required=True, help="FIT.json written by `delphi fit` (parametric, moe, isoflop, envelope, frontier)"
    )
    p.add_argument(
        "--hero",
        help="HERO.yaml: the hero's train config (or give it by --hero-params and --hero-tokens, or --hero-compute)",
    )
    p.add_argument(
        "--hero-params",
        metavar="N",
        help="the hero's N, counted as the results table counts params "
        "(with --hero-tokens): a hero trained elsewhere, with no Delphi config",
    )
    p.add_argument("--hero-tokens", metavar="D", help="the hero's training tokens D (with --hero-params)")
    p.add_argument(
        "--hero-flops",
        metavar="C",
        help="the hero's exact training FLOPs (default: the fit's FLOPs family at N and D, else 6ND)",
    )
    p.add_argument("--hero-compute", metavar="C", help="a hero sized by the fit's own allocation at C FLOPs (N*, D*)")
    p.add_argument("--ladder", help="ladder dir: its runs' curves fit the trajectory law; its manifest is hashed")
    p.add_argument(
        "--results",
        help="results table (hashed; default LADDER/results.csv if present); CSV, JSON, "
        "JSONL or Parquet, read with the column mapping below as `delphi fit` reads it",
    )
    add_column_options(p)
    p.add_argument("--curve-fit", help="a curve-law JSON from `delphi prereg curves` instead of fitting --ladder")
    p.add_argument("--out", required=True, help="preregistrations/NAME.yaml")
    p.add_argument(
        "--tolerance", type=positive_float, default=0.01, help="relative tolerance of the decision rule (default 0.01)"
    )
    p.add_argument("--author")
    p.add_argument("--rationale", default="", help="free text: why this prediction")
    p.add_argument("--assume", action="append", default=[], help="an assumption (repeatable)")
    p.add_argument("--bootstrap", type=nonnegative_int, default=200, help="curve-law bootstrap replicates")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument(
        "--force", action="store_true", help="seal even if a gate fails (recorded in the sealed file and every verdict)"
    )
    p.add_argument("--rehearsal", help="a finished dress-rehearsal run dir (~3x the top budget): its error is a gate")
    p.add_argument(
        "--probe",
        metavar="RUN_DIR",
        action="append",
        default=[],
        help="a finished run beyond the ladder, sealed before it trained (repeatable): gate probes scores the "
        "law on it, and gate method_agreement sets aside a cross-check law it rejects",
    )
    p.add_argument(
        "--probe-correction",
        action="store_true",
        help="seal the law x (1 + its error trend at the probes, carried to the hero by --probe-carry); "
        "gate probes then tests the trend on the furthest probe (needs >= 3 --probe)",
    )
    p.add_argument(
        "--probe-carry",
        choices=PROBE_CARRIES,
        default="linear",
        help="--probe-correction: carry the error by least squares linear in log C through every probe "
        "(default) or along the line through the two furthest",
    )
    p.add_argument(
        "--noise-scope",
        choices=NOISE_SCOPES,
        default="pooled",
        help="one run's seed noise at the hero and the probes: the within-cell seed sd pooled over every "
        "budget (default) or over the top isoFLOP budget's cells only",
    )
    p.add_argument(
        "--trajectory-from-probes",
        action="store_true",
        help="the trajectory's shape from the longest --probe (its eval curve over its final loss, at the "
        "same fractions of training) instead of the curve law fitted on the ladder",
    )
    p.add_argument(
        "--lr-calibration",
        metavar="LR_CALIBRATION.json",
        nargs="+",
        help="`delphi ladder lr-calibrate` reports: gate lr_transfer checks --ladder's LR rule against their points",
    )
    p.add_argument(
        "--recipe-check",
        metavar="RECIPE_CHECK.json",
        default=None,
        help="a `delphi ladder recipe-check` report: gate recipe refuses a recipe that loses > 0.5%% anywhere",
    )
    p.add_argument("--backtest", help="BACKTEST.json of the same law (default: refitted here)")
    p.add_argument("--min-seeds", type=int, default=None, help="gate: seeds needed in every ladder cell (default 2)")
    p.add_argument(
        "--interval-factor", type=float, default=None, help="gate: 90%% half-width <= this x tolerance (default 1.5)"
    )
    p.add_argument(
        "--agreement-tolerance",
        type=positive_float,
        default=None,
        help="gate method_agreement: cross-check laws within this relative distance (default --tolerance)",
    )
    add_json_flag(p)
    p.set_defaults(func=_create)

    p = sub.add_parser("verify", help="recompute the seal; with a run, flag creation after its first step")
    p.add_argument("file")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--run", action="append", help="the hero's run dir; a multi-seed seal: one --run per sealed seed")
    g.add_argument("--wandb", help="ENTITY/PROJECT/RUN")
    add_json_flag(p)
    p.set_defaults(func=_verify)

    p = sub.add_parser("check", help="compare a (live) run with the preregistered band")
    p.add_argument("file")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--run",
        action="append",
        help="the hero's run: a Delphi run dir, another trainer's metrics log (JSONL, CSV, TSV, a W&B history "
        "export as CSV or JSON) or a directory holding one; a multi-seed seal: one --run per sealed seed",
    )
    g.add_argument("--wandb", help="ENTITY/PROJECT/RUN (W&B public API; needs network)")
    add_log_options(p)
    p.add_argument(
        "--finished",
        action="store_true",
        help="the log is complete (its trainer has stopped): judge it now; a log that ends short of the "
        "hero's tokens is then an error (a Delphi run dir's status.json says this itself)",
    )
    p.add_argument("--plot", help="write prediction-vs-actual figure OUT.png (+ .svg)")
    p.add_argument(
        "--shape",
        metavar="RUN_DIR",
        help="a finished run on the hero's schedule (e.g. the longest probe): "
        "project each eval point to a final loss on its curve (not a verdict)",
    )
    p.add_argument(
        "--watch",
        action="store_true",
        help="poll until the verdict is final (a log: once an eval reaches the hero's tokens or steps)",
    )
    p.add_argument("--interval", type=positive_float, default=10.0, help="seconds between polls with --watch")
    p.add_argument("--timeout", type=positive_float, default=None, help="stop watching after this many seconds")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace --plot's files even if this command did not write them (not the outcome file: "
        "that is bound to the run it scored)",
    )
    add_json_flag(p)
    p.set_defaults(func=_check)

    p = sub.add_parser("index", help="regenerate DIR/README.md: every preregistration and its outcome")
    p.add_argument("dir", nargs="?", default="preregistrations")
    p.add_argument("--force", action="store_true", help="replace DIR/README.md even if `prereg index` did not write it")
    p.add_argument(
        "--paper-root",
        default="paper",
        help="the paper's directory: an outcome whose runs are not where it scored them is recomputed from "
        "the runs its editions hold, as `paper verify` does (default: paper, if it exists)",
    )
    add_json_flag(p)
    p.set_defaults(func=_index)

    p = sub.add_parser("curves", help="fit the LR-annealing curve law to a ladder's curves (and backtest it)")
    p.add_argument("ladder", help="ladder dir (or any dir holding run dirs)")
    p.add_argument("--out", help="CURVES.json")
    p.add_argument("--plot", help="figure OUT.png (+ .svg)")
    p.add_argument("--bootstrap", type=nonnegative_int, default=200)
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--no-backtest", action="store_true")
    p.add_argument("--force", action="store_true", help="replace --out/--plot even if this command did not write them")
    add_json_flag(p)
    p.set_defaults(func=_curves)

    prereg.set_defaults(func=lambda args: (prereg.print_help(sys.stderr), ({"error": "give a subcommand"}, 2))[1])


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def _create(args: argparse.Namespace):
    from delphi.prereg import gates as gt  # lazy: pandas
    from delphi.prereg.create import create_prereg, gates_path  # lazy: pandas
    from delphi.prereg.evidence import Evidence, PredictionRule, SealTerms  # lazy: pandas and the fits

    options = {
        k: v
        for k, v in (
            ("min_seeds", args.min_seeds),
            ("interval_width_factor", args.interval_factor),
            ("agreement_tolerance_rel", args.agreement_tolerance),
        )
        if v is not None
    }
    thresholds = gt.GateThresholds(tolerance_rel=args.tolerance, **options).validate("prereg create")
    check_output_file(
        args.out,
        inputs=(
            args.fit,
            args.hero,
            args.results,
            args.curve_fit,
            args.backtest,
            args.rehearsal,
            *(args.lr_calibration or ()),
            *args.probe,
            args.recipe_check,
        ),
    )
    reading = table_options(args)
    if args.results is None and args.ladder is None and not reading.is_default:
        raise DelphiError(
            "prereg create: the column mapping and --query read the results table: give --results (or --ladder)"
        )
    hero_numbers = {
        "params": args.hero_params,
        "tokens": args.hero_tokens,
        "flops": args.hero_flops,
        "compute": args.hero_compute,
    }
    backtest = read_json(args.backtest, what="backtest JSON") if args.backtest else None
    try:
        doc = create_prereg(
            Evidence(
                fit_path=Path(args.fit),
                results=Path(args.results) if args.results else None,
                ladder=Path(args.ladder) if args.ladder else None,
                options=reading,
                curve_fit_path=Path(args.curve_fit) if args.curve_fit else None,
                backtest=backtest,
                rehearsal_run=Path(args.rehearsal) if args.rehearsal else None,
                lr_calibration=[Path(p) for p in args.lr_calibration] if args.lr_calibration else None,
                probe_runs=[Path(p) for p in args.probe],
                recipe_check=Path(args.recipe_check) if args.recipe_check else None,
            ),
            Path(args.out),
            hero_path=Path(args.hero) if args.hero else None,
            hero_numbers=hero_numbers,
            rule=PredictionRule(
                probe_correction=args.probe_correction, probe_carry=args.probe_carry, noise_scope=args.noise_scope
            ),
            terms=SealTerms(
                tolerance_rel=args.tolerance,
                thresholds=thresholds,
                force=args.force,
                author=args.author,
                rationale=args.rationale,
                assumptions=args.assume,
                trajectory_from_probes=args.trajectory_from_probes,
                curve_bootstrap=args.bootstrap,
                curve_seed=args.seed,
            ),
        )
    except CheckFailed as refused:
        report = json.loads(gates_path(Path(args.out)).read_text())
        for line in gt.gate_lines(gt.Gate.from_json(g) for g in report["gates"]):
            _say(f"  {line}")
        refused.result = {
            "file": None,
            "sealed": False,
            "refused": args.out,
            "gates_file": str(gates_path(Path(args.out))),
            "failed_gates": report.get("failed", []),
            "gates": report["gates"],
        }
        raise
    for line in gt.gate_lines(gt.Gate.from_json(g) for g in doc.get("gates", [])):
        _say(f"  {line}")
    if doc.get("forced"):
        _say("SEALED WITH --force: gates failed (recorded in the sealed file)")
    final = doc["prediction"]["final"]
    i90 = final.get("loss_90") or [float("nan")] * 2
    for line in forecast_lines(doc):
        _say(line)
    _say(
        f"wrote {args.out}: final loss {final['loss']:.4f} (90% [{i90[0]:.4f}, {i90[1]:.4f}]), "
        f"{len(doc['prediction']['trajectory']['points'])} trajectory points, seal {doc['seal']['digest'][:12]}"
    )
    return {
        "file": args.out,
        "id": doc["id"],
        "seal": doc["seal"]["digest"],
        "final": final,
        "forced": doc.get("forced", False),
        "gates": doc.get("gates", []),
        "hero": {k: v for k, v in doc["hero"].items() if k != "config"},
        "trajectory_points": len(doc["prediction"]["trajectory"]["points"]),
    }


def forecast_lines(doc: dict) -> list[str]:
    """What a sealed forecast rests on, for the terminal: the hero's N, D and C as used (a config's
    defaults, e.g. d_ff, show here), which point decides and why, and how much a lab's E prior decides."""
    hero, final = doc["hero"], doc["prediction"]["final"]
    shape = ""
    if isinstance(hero.get("config"), dict):
        m = hero["config"].get("model") or {}
        shape = " from the config: " + ", ".join(
            f"{k} {m[k]}" for k in ("d_model", "n_layers", "n_heads", "d_ff") if k in m
        )
    lines = [
        f"hero: N = {hero['params']:.4g}, D = {hero['tokens']:.4g} ({hero['tokens'] / hero['params']:.3g} tokens per "
        f"parameter), C = {hero['flops']:.4g} FLOPs"
        + (f" ({hero['flops_how']})" if hero.get("flops_how") else "")
        + shape
    ]
    point = final.get("point")
    if point:
        law = final.get("law")
        lines.append(f"point: {point['why']}" + (f"; the law's own point {law['loss']:.4f}" if law else ""))
    if (
        point
        and point.get("decides") == "calibrated"
        and (final.get("calibrated") or {}).get("table_is_calibration_source")
    ):
        lines.append(
            "note: the table's file is the data the calibration was made from: where its sweep is one of the "
            "calibration's sources, the calibrated centre is in-sample for it"
        )
    if final.get("E_prior"):
        lines.append(f"E prior: {final['E_prior']['text']}")
    return lines


def _verify(args: argparse.Namespace):
    from delphi.prereg.verify import verify  # lazy: pandas

    result = verify(
        Path(args.file), run_dirs=[resolve_data(r) for r in args.run] if args.run else None, wandb_path=args.wandb
    )
    _say(
        f"{args.file}: "
        + ("seal ok" if result["seal_ok"] else "SEAL BROKEN")
        + (
            ""
            if "created_before_start" not in result
            else "; THE RUN'S START CANNOT BE ESTABLISHED"
            if result["created_before_start"] is None
            else (
                "; created before the run's first step"
                if result["created_before_start"]
                else "; CREATED AFTER THE RUN STARTED"
            )
        )
    )
    anchor = result.get("first_commit") or {}
    if result.get("seal_commit"):
        c = result["seal_commit"]
        _say(
            f"  first committed in {c['commit'][:12]} at {c['time']}"
            + ("; the file is as first committed" if anchor.get("state") == "same" else "; THE FILE HAS CHANGED SINCE")
            + (
                ""
                if "commit_before_start" not in result
                else "; before the first step of every run checked"
                if result["commit_before_start"]
                else "; AFTER the first step of a run checked"
            )
        )
    else:
        _say(
            f"  NOT ANCHORED ({anchor.get('state', 'unknown')}): only the file's own seal was checked, which anyone "
            "can recompute"
        )
    for problem in result["problems"]:
        _say(f"  problem: {problem}")
    for warning in result.get("warnings", []):
        _say(f"  WARNING: {warning}")
    return result, 0 if result["ok"] else 1


def _check(args: argparse.Namespace):
    from delphi.prereg import check as ck  # lazy: pandas

    run_dirs = (
        [resolve_data(r) for r in args.run] if args.run else None
    )  # a run inside a compact edition: its unpacked copy
    for run_dir in run_dirs or []:
        if not run_dir.exists():
            raise DelphiError(f"{run_dir}: run dir or metrics log not found")
    if args.finished and args.watch:
        raise DelphiError(
            "--finished with --watch: a watch follows a log until it reaches the hero's end; "
            "--finished judges a complete log once"
        )
    log = LogOptions(log_columns(args), finished=args.finished)
    run_dir = run_dirs[0] if run_dirs else None
    if args.plot:
        if not Path(args.plot).parent.exists():
            raise DelphiError(f"--plot {args.plot}: directory does not exist")
        for path in _figure_files(args.plot):
            check_output_file(
                path, inputs=(args.file, run_dir, args.shape), flag="--plot", command="prereg check", force=args.force
            )
    if args.watch:
        result, prereg, run = ck.watch(
            Path(args.file),
            run_dir=None,
            wandb_path=args.wandb,
            interval_s=args.interval,
            timeout_s=args.timeout,
            on_update=_say_progress,
            run_dirs=run_dirs,
            log=log,
            on_wait=_say,
        )
    else:
        result, prereg, run = ck.check(Path(args.file), wandb_path=args.wandb, run_dirs=run_dirs, log=log)
    for described in [result.get("log"), *(s.get("log") for s in result.get("seeds") or [])]:
        if described:
            _say(f"read {described['path']}: " + ", ".join(f"{k} = {v}" for k, v in described["columns"].items()))
    _say(f"{result['verdict']}: {result['why']}")
    if result.get("judged") and result["verdict"] != "in-progress":  # in-progress says it in its why
        _say(f"  judged: {result['judged']}")
    if result.get("watch"):
        _say(result["watch"])
    for name, row in (result.get("competing") or {}).items():
        if "rel_error" in row:
            _say(
                f"  sealed beside it, {name}: {row['predicted']:.4f} ({row['rel_error']:+.2%}), 90% "
                f"{'covered' if row['covered_90'] else 'missed'}"
            )
    if result.get("outcome_kept"):
        _say(f"  outcome not recorded: {result['outcome_kept']}")
    if args.shape:
        result = ck.with_projection(result, prereg, resolve_data(args.shape))
        for p in result["projection"]["points"]:
            _say(
                f"  at {p['fraction']:.0%} of training, on {Path(args.shape).name}'s curve: final {p['projected_final']:.4f} "
                f"({p['vs_predicted']:+.2%} vs the sealed {float(prereg.final['loss']):.4f})"
            )
    if args.plot:
        from delphi.plot.figures import prediction_figure  # lazy: matplotlib
        from delphi.plot.style import save_figure  # lazy: matplotlib

        seed_runs = (
            {s["seed"]: ck.read_hero_run(prereg.doc, Path(s["run"]), None, log) for s in result["seeds"]}
            if result.get("seeds")
            else None
        )
        fig = prediction_figure(prereg.doc, run, verdict=result["verdict"], seed_runs=seed_runs)
        result["plot"] = save_figure(fig, args.plot, written_by="prereg check")
    return result, ck.exit_code(result["verdict"])


def _say_progress(result: dict) -> None:
    _say(f"[{result['status']}] {result['verdict']}: {result['why']}")


def _figure_files(out: str) -> list[Path]:
    """OUT.png and OUT.svg: the two files `save_figure` writes for OUT."""
    stem = Path(out).with_suffix("") if Path(out).suffix.lower() in (".png", ".svg") else Path(out)
    return [stem.with_suffix(".png"), stem.with_suffix(".svg")]


def _index(args: argparse.Namespace):
    from delphi.prereg.index import write_index  # lazy: pandas

    result = write_index(args.dir, force=args.force, paper_root=args.paper_root)
    _say(f"wrote {result['index']} ({result['n']} preregistrations)")
    return result


def _curves(args: argparse.Namespace):
    from delphi.fits import curves as cv  # lazy: jax and scipy
    from delphi.ladder.manifest import ladder_own_paths  # lazy: pandas

    for flag, path in (("--out", args.out), ("--plot", args.plot)):
        if path is not None:
            for file in [Path(path)] if flag == "--out" else _figure_files(path):
                check_output_file(
                    file, protected=ladder_own_paths(args.ladder), flag=flag, command="prereg curves", force=args.force
                )
    curves = cv.load_ladder_curves(args.ladder)
    fit = cv.fit_curve_law(curves, bootstrap=args.bootstrap, seed=args.seed, lr_ref=cv.ladder_lr_ref(args.ladder))
    _say(fit.summary())
    result = {"fit": fit.to_json()}
    backtest = None
    if not args.no_backtest and len({c.params for c in curves}) >= 3:
        backtest = cv.backtest_curve_law(curves, bootstrap=min(args.bootstrap, 100), seed=args.seed)
        result["backtest"] = backtest
        for p in backtest["points"]:
            _say(
                f"  backtest {p['fraction']:.0%} of tokens: predicted {p['predicted']:.4f} actual {p['actual']:.4f} ({p['rel_error']:+.2%})"
            )
    if args.out:
        atomic_write_json(args.out, fit.to_json(), written_by="prereg curves")
    if args.plot:
        from delphi.plot.figures import curves_figure  # lazy: matplotlib
        from delphi.plot.style import save_figure  # lazy: matplotlib

        result["plot"] = save_figure(curves_figure(curves, fit, backtest), args.plot, written_by="prereg curves")
    return result
