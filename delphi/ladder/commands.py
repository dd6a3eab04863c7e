"""`delphi ladder plan | run | collect | hero`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from delphi.cli import add_device_flag, add_json_flag, nonnegative_int, positive_float, positive_int
from delphi.errors import DelphiError
from delphi.io import atomic_write_json, atomic_write_yaml, read_yaml
from delphi.ladder.recipe import unsourced_constants
from delphi.ladder.spec import load_ladder_spec
from delphi.path_policy import check_not_an_input, check_output_dir, check_output_file
from delphi.train.config import train_config_to_dict


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    ladder = subparsers.add_parser("ladder", help="plan, run and collect a ladder of compute-optimal runs")
    sub = ladder.add_subparsers(dest="ladder_command", metavar="SUBCOMMAND")

    plan = sub.add_parser("plan", help="one train config per rung + manifest.csv")
    plan.add_argument("spec", metavar="SPEC.yaml")
    plan.add_argument("--out", required=True, metavar="LADDER_DIR")
    plan.add_argument(
        "--force",
        action="store_true",
        help="replace a ladder.yaml or configs/*.yaml in a directory with no manifest.csv (never SPEC itself)",
    )
    add_json_flag(plan)
    plan.set_defaults(func=_plan)

    run = sub.add_parser("run", help="train every rung that is not completed")
    run.add_argument("ladder_dir", metavar="LADDER_DIR")
    run.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="parallel rungs (default: one per CPU core, at most one per pending rung and per GiB "
        "of free memory; each worker pinned to its cores)",
    )
    run.add_argument("--retries", type=nonnegative_int, default=1, help="retries of a failed rung (default 1)")
    run.add_argument(
        "--budgets",
        type=positive_float,
        nargs="+",
        default=None,
        metavar="C",
        help="train only these budgets' rungs (default: all): a long ladder in stages, each committed "
        "as it completes; `delphi study` later trains what is left",
    )
    run.add_argument(
        "--group-seeds",
        action="store_true",
        help="train the seeds of one cell together as one vmapped program on one worker (local "
        "executor only; off by default: measured slower than rungs alone on a 2-core CPU)",
    )
    run.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="local worker processes, or one Ray task per rung (pip install 'delphi[ray]')",
    )
    ray_opts = run.add_argument_group("--executor ray")
    ray_opts.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join ('auto', host:port, ray://host:10001; default: a local Ray instance)",
    )
    ray_opts.add_argument(
        "--cpus-per-rung", type=positive_float, default=None, help="Ray num_cpus of each rung (default 1)"
    )
    ray_opts.add_argument("--gpus-per-rung", type=float, default=None, help="Ray num_gpus of each rung (default 0)")
    ray_opts.add_argument(
        "--worker-retries",
        type=nonnegative_int,
        default=None,
        help="Ray max_retries: resubmits after a worker dies (default 3)",
    )
    add_device_flag(run)
    add_json_flag(run)
    run.set_defaults(func=_run)

    collect = sub.add_parser("collect", help="results table (canonical columns) from the run dirs")
    collect.add_argument("ladder_dir", metavar="LADDER_DIR")
    collect.add_argument("--out", required=True, metavar="RESULTS.csv")
    collect.add_argument("--all", action="store_true", help="include rungs that did not complete (empty loss)")
    collect.add_argument(
        "--force", action="store_true", help="replace --out even if it is not a table this command wrote"
    )
    add_json_flag(collect)
    collect.set_defaults(func=_collect)

    export = sub.add_parser("export", help="every hyperparameter of every rung, for another trainer (docs/export.md)")
    export.add_argument("ladder_dir", metavar="LADDER_DIR", help="a ladder planned by `delphi ladder plan`")
    export.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="FILE.csv (one row per rung) or FILE.json (with the conventions of every number)",
    )
    export.add_argument(
        "--force", action="store_true", help="replace --out even if it is not a file this command wrote"
    )
    add_json_flag(export)  # the object is the export itself (as --out FILE.json holds it), with "out"
    export.set_defaults(func=_export)

    family = sub.add_parser(
        "family", help="the spec's exact FLOPs per token against N (FAMILY.json for delphi fit --family)"
    )
    family.add_argument("spec", metavar="SPEC.yaml")
    family.add_argument("--out", required=True, metavar="FAMILY.json")
    family.add_argument(
        "--convention",
        choices=("nonembedding", "active", "fpt6"),
        default="nonembedding",
        help="how N is counted (default nonembedding, the results table's params)",
    )
    family.add_argument("--max-width", type=int, default=None, help="widest shape (default 64x the ladder's widest)")
    family.add_argument(
        "--force", action="store_true", help="replace --out even if it is not a file this command wrote (never SPEC)"
    )
    add_json_flag(family)
    family.set_defaults(func=_family)

    hero = sub.add_parser("hero", help="compute-optimal hero config at compute C from a fit")
    hero.add_argument("--fit", required=True, metavar="FIT.json")
    hero.add_argument("--compute", required=True, type=positive_float, metavar="C")
    hero.add_argument("--spec", required=True, metavar="SPEC.yaml")
    hero.add_argument("--out", required=True, metavar="HERO.yaml")
    hero.add_argument("--seed", type=nonnegative_int, default=0)
    hero.add_argument(
        "--force",
        action="store_true",
        help="replace --out even if it is not a config this command wrote (never --fit or --spec)",
    )
    add_json_flag(hero)
    hero.set_defaults(func=_hero)

    cal = sub.add_parser(
        "lr-calibrate",
        help="train the spec's own rungs at multiples of the transfer rule's LR; where the optimum drifts with width and horizon",
    )
    cal.add_argument("spec", metavar="SPEC.yaml")
    cal.add_argument(
        "--points",
        required=True,
        nargs="+",
        metavar="D@TOKENS",
        help="shapes and horizons to calibrate at, e.g. 32@8.4e6 96@4.2e6 (d_model@tokens); "
        "include the hero's width and horizons past the ladder's",
    )
    cal.add_argument(
        "--multipliers",
        type=positive_float,
        nargs="+",
        default=None,
        metavar="M",
        help="LRs tried, in units of the rule's (default 0.125 0.25 0.5 1 2)",
    )
    cal.add_argument(
        "--batch",
        type=positive_int,
        default=None,
        metavar="SEQS",
        help="sequences per step (default: the top budget's, which the hero continues); another "
        "batch checks the rule's batch term where the smaller budgets train",
    )
    cal.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="a ladder directory; a rerun resumes it, new points or multipliers extend it",
    )
    cal.add_argument("--workers", type=positive_int, default=None, help="parallel runs (default: as `ladder run`)")
    cal.add_argument(
        "--force",
        action="store_true",
        help="plan into a directory with no manifest.csv even if it holds a ladder.yaml or configs/*.yaml",
    )
    add_device_flag(cal)
    add_json_flag(cal)
    cal.set_defaults(func=_lr_calibrate)

    check = sub.add_parser(
        "recipe-check",
        help="train the recipe's LR and batch sweeps from the smallest rung to the planned hero; the loss it leaves on the table",
    )
    check.add_argument("spec", metavar="SPEC.yaml", help="a ladder spec with a recipe: section and its recipe.check")
    check.add_argument("--out", required=True, metavar="DIR", help="a ladder directory; a rerun resumes it")
    check.add_argument(
        "--prior",
        action="append",
        default=[],
        metavar="DIR",
        help="an earlier recipe check of this spec under other recipe constants (repeatable): its runs "
        "join the sweep at their LR, and the multipliers they cover are not trained again",
    )
    check.add_argument("--plan-only", action="store_true", help="plan the sweep and report its cost; train nothing")
    check.add_argument("--workers", type=positive_int, default=None, help="parallel runs (default: as `ladder run`)")
    add_device_flag(check)
    add_json_flag(check)
    check.set_defaults(func=_recipe_check)

    ladder.set_defaults(func=lambda args: (ladder.print_help(sys.stderr), ({}, 2))[1])


def _plan(args: argparse.Namespace) -> dict:
    from delphi.ladder import plan_report  # lazy: imports pandas (delphi.fits.data, via delphi.ladder.plan)
    from delphi.ladder.manifest import format_table, write_ladder  # lazy: imports pandas
    from delphi.ladder.plan import plan_ladder  # lazy: imports pandas

    check_output_dir(args.out, inputs=(args.spec,))
    check_ladder_dir_writes(args.out, args.spec, force=args.force)
    spec = load_ladder_spec(args.spec)
    raw = read_yaml(args.spec)
    rungs = plan_ladder(spec)  # refuses an absurd plan (bounds.min_tokens_per_param) before anything is written
    # No token store is read: `ladder run` and `train` check the store where training starts.
    rows = write_ladder(spec, rungs, args.out)
    print(format_table(rows), file=sys.stderr)
    notes = (
        plan_report.scale_default_notes(raw)
        + plan_report.binding_cap_notes(spec, raw, rungs)
        + plan_report.head_size_notes(spec, rungs)
    )
    health = plan_report.plan_health_warnings(spec, rungs)
    if spec.recipe is not None:
        health += [
            f"{key}: no source (a citation or the measurement file it came from)"
            for key in unsourced_constants(spec.recipe)
        ]
    warnings = health + plan_report.tokens_per_param_warnings(spec, rungs) + plan_report.unused_key_warnings(raw)
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    total = sum(float(r["flops"]) for r in rows)
    worst = max(abs(float(r["flops_error"])) for r in rows)
    ratios = [float(r["tokens_per_param"]) for r in rows]
    families = len(spec.variants())
    print(
        f"{len(rows)} rungs over {len(spec.budgets)} budgets"
        + (f" and {families} expert configurations" if families > 1 else "")
        + f", {total:.3g} FLOPs in all, worst budget error {worst:.2%}, {min(ratios):.3g}-{max(ratios):.3g} tokens per "
        f"parameter; wrote {args.out}/manifest.csv (run.store {spec.run.store} is checked when training starts)",
        file=sys.stderr,
    )
    return {
        "out": str(args.out),
        "rungs": rows,
        "flops_total": total,
        "max_flops_error": worst,
        "health_warnings": health,
        "warnings": warnings,
        "notes": notes,
        "defaults": plan_report.scale_defaults_json(raw),
    }


def check_ladder_dir_writes(out: str, spec_path: str, *, force: bool) -> None:
    """Before planning into `out`: the spec must not be one of the files the plan writes there
    (its manifest, ladder.yaml, configs/), and in a directory without a manifest.csv (not a
    ladder Delphi planned) an existing ladder.yaml or configs/*.yaml is the user's: exit 2
    unless `force`. A directory with a manifest is Delphi's: `write_ladder` replans the same
    ladder there, or refuses a different one."""
    from delphi.ladder.manifest import CONFIG_DIR, MANIFEST_FILE, SPEC_FILE, ladder_own_paths  # lazy: imports pandas

    out_dir = Path(out)
    check_not_an_input(ladder_own_paths(out_dir), (spec_path,))
    if force or (out_dir / MANIFEST_FILE).is_file():
        return
    theirs = [p for p in (out_dir / SPEC_FILE, *sorted((out_dir / CONFIG_DIR).glob("*.yaml"))) if p.is_file()]
    if theirs:
        more = f" and {len(theirs) - 1} more" if len(theirs) > 1 else ""
        raise DelphiError(
            f"--out {out}: holds {theirs[0]}{more} but no {MANIFEST_FILE}, so not a ladder delphi planned; "
            "`ladder plan` would replace them: choose another directory, or pass --force"
        )


def _run(args: argparse.Namespace):
    from delphi.ladder.runner import run_ladder  # lazy: imports jax (the trainer)

    if args.executor == "ray":
        from delphi.ladder.ray_executor import run_ray_ladder_from_args  # lazy: imports jax, and ray when used

        result = run_ray_ladder_from_args(args)
    else:
        from delphi.ladder.ray_executor import reject_ray_options  # lazy: imports jax

        reject_ray_options(args)
        result = run_ladder(
            args.ladder_dir,
            workers=args.workers,
            retries=args.retries,
            group_seeds=args.group_seeds,
            budgets=None if args.budgets is None else tuple(args.budgets),
        )
    print(
        f"ladder {args.ladder_dir}: {result['completed']} completed, {result['diverged']} diverged, "
        f"{len(result['failed'])} failed of {result['rungs']} rungs in {result['wall_s']:.0f} s",
        file=sys.stderr,
    )
    return (result, 1) if result["failed"] else result


def _collect(args: argparse.Namespace) -> dict:
    from delphi.ladder.collect import (  # lazy: imports pandas
        collect_ladder,
        family_path,
        format_health_table,
        rung_health_table,
        write_results,
    )
    from delphi.ladder.manifest import ladder_own_paths, read_manifest  # lazy: imports pandas

    check_output_file(args.out, protected=ladder_own_paths(args.ladder_dir), command="ladder collect", force=args.force)
    check_output_file(
        family_path(args.out), protected=ladder_own_paths(args.ladder_dir), command="ladder collect", force=args.force
    )
    total = len(read_manifest(args.ladder_dir))
    frame = collect_ladder(args.ladder_dir, include_all=args.all)
    write_results(frame, args.out, written_by="ladder collect")  # and <out>.family.json from the pinned spec
    health = rung_health_table(frame)
    if len(health):
        print(format_health_table(health), file=sys.stderr)
    complete = int((frame["status"] == "completed").sum()) if len(frame) else 0
    family = family_path(args.out)
    print(
        f"wrote {args.out}: {len(frame)} rows ({complete} completed of {total} rungs)"
        + (f" and {family}" if family.is_file() else ""),
        file=sys.stderr,
    )
    return {
        "out": str(args.out),
        "rows": len(frame),
        "completed": complete,
        "rungs": total,
        "healthy": int(health["health_ok"].sum()),
        "unhealthy_runs": list(health.loc[~health["health_ok"], "run_id"]),
        "family": str(family) if family.is_file() else None,
    }


def _export(args: argparse.Namespace) -> dict:
    from delphi.ladder.export import (  # lazy: imports jax (delphi.train.optim)
        export_format,
        export_ladder,
        write_export,
    )
    from delphi.ladder.manifest import ladder_own_paths  # lazy: imports pandas

    if args.out is None and not args.json:
        raise DelphiError("ladder export: give --out FILE.csv or FILE.json, or --json to print it")
    if args.out is not None:
        export_format(args.out)
        check_output_file(
            args.out, protected=ladder_own_paths(args.ladder_dir), command="ladder export", force=args.force
        )
    doc = export_ladder(args.ladder_dir)
    rungs = doc["rungs"]
    if args.out is not None:
        write_export(doc, args.out, written_by="ladder export")
    print(
        f"{len(rungs)} rungs, {len(rungs[0])} numbers each, {doc['ladder']['flops_total']:.3g} FLOPs in all"
        + (f"; wrote {args.out}" if args.out is not None else ""),
        file=sys.stderr,
    )
    return {"out": args.out, **doc}


def _family(args: argparse.Namespace) -> dict:
    from delphi.ladder.family import flops_family  # lazy: imports pandas

    if args.max_width is not None and args.max_width <= 0:
        raise DelphiError(
            f"--max-width: {args.max_width}, expected a positive d_model (the widest shape of the family)"
        )
    check_output_file(args.out, inputs=(args.spec,), command="ladder family", force=args.force)
    spec = load_ladder_spec(args.spec)
    family = flops_family(spec, args.convention, args.max_width)
    family = dataclasses.replace(family, source=f"ladder spec {args.spec}")
    atomic_write_json(args.out, family.to_json(), written_by="ladder family")
    print(
        f"wrote {args.out}: {len(family.params)} shapes, N ({args.convention}) {family.params[0]:.3g} .. "
        f"{family.params[-1]:.3g}, FLOPs/token {family.flops_per_token[0]:.3g} .. {family.flops_per_token[-1]:.3g}",
        file=sys.stderr,
    )
    return {"out": str(args.out), "shapes": len(family.params), "convention": args.convention}


def _hero(args: argparse.Namespace) -> dict:
    from delphi.ladder.hero import hero_from_fit  # lazy: imports scipy and pandas (delphi.fits)
    from delphi.ladder.manifest import format_table  # lazy: imports pandas

    check_output_file(args.out, inputs=(args.fit, args.spec), command="ladder hero", force=args.force)
    spec = load_ladder_spec(args.spec)
    if not Path(args.fit).is_file():
        raise DelphiError(f"--fit: {args.fit}: file not found")
    rung, details = hero_from_fit(args.fit, args.compute, spec, seed=args.seed)
    atomic_write_yaml(args.out, train_config_to_dict(rung.train), written_by="ladder hero")
    print(format_table([details]), file=sys.stderr)
    print(
        f"hero at C={args.compute:.3g}: predicted N*={details['predicted_params']:.4g} ({details['params_convention']} params), "
        f"chosen x{details['params_ratio_to_predicted']:.2f} of it (non-embedding N={details['params']:,}), "
        f"D={details['tokens']:,}; wrote {args.out}",
        file=sys.stderr,
    )
    return {"out": str(args.out), **details}


def _lr_calibrate(args: argparse.Namespace) -> dict:
    from delphi.ladder.lr_calibration import (  # lazy: imports pandas
        DEFAULT_MULTIPLIERS,
        Point,
        analyse,
        save_report,
        write_calibration,
    )
    from delphi.ladder.runner import run_ladder  # lazy: imports jax (the trainer)

    check_output_dir(args.out, inputs=(args.spec,))
    check_ladder_dir_writes(args.out, args.spec, force=args.force)
    spec = load_ladder_spec(args.spec)
    points = [Point.parse(text) for text in args.points]
    multipliers = tuple(args.multipliers) if args.multipliers else DEFAULT_MULTIPLIERS
    write_calibration(spec, points, multipliers, args.out, args.batch)
    run = run_ladder(args.out, workers=args.workers)
    result = analyse(spec, args.out)
    path = save_report(result, args.out)
    print(result.summary(), file=sys.stderr)
    print(f"wrote {path}", file=sys.stderr)
    return (result.to_json(), 1) if run["failed"] else result.to_json()


def _recipe_check(args: argparse.Namespace):
    from delphi.ladder.recipe_check_analysis import analyse  # lazy: imports pandas
    from delphi.ladder.recipe_check_plan import write_check  # lazy: imports pandas
    from delphi.ladder.recipe_check_report import format_report, save_report  # lazy: imports pandas

    check_output_dir(args.out, inputs=(args.spec,))
    spec = load_ladder_spec(args.spec)
    # refuses a check that does not reach the hero, or a --prior that is no check of this spec, before writing
    rungs, _, summary = write_check(spec, args.out, args.prior)
    h = summary["hero"]
    print(
        f"recipe check: {summary['runs']} runs, {summary['check_flops']:.3g} FLOPs = {summary['compute_ratio']:.1%} of the "
        f"study's {summary['study_flops']:.3g} (ladder {summary['ladder_flops']:.3g} + runs beyond it; limit "
        f"{summary['max_compute_ratio']:.0%}); expected wall {summary['check_wall_s_estimate'] / 3600:.2f} h on 2 cores "
        f"(ladder: {summary['ladder_wall_s_estimate'] / 3600:.2f} h); planned hero {h['run_id']} "
        f"(d{h['d_model']}, {h['tokens']:.3g} tokens)",
        file=sys.stderr,
    )
    for prior in summary["priors"]:
        unfinished = f"; {prior['not_ended']} not ended there yet: finish that check for their losses"
        print(
            f"reused from --prior {prior['dir']}: {prior['runs']} runs ({prior['flops']:.3g} FLOPs)"
            + (unfinished if prior["not_ended"] else ""),
            file=sys.stderr,
        )
    if summary["compute_ratio"] > summary["max_compute_ratio"]:
        print(
            f"warning: the check costs {summary['compute_ratio']:.1%} of the study, above "
            f"{summary['max_compute_ratio']:.0%} (issue 29)",
            file=sys.stderr,
        )
    if args.plan_only:
        return {"out": str(args.out), **summary}
    from delphi.ladder.runner import run_ladder  # lazy: imports jax (the trainer)

    run = run_ladder(args.out, workers=args.workers)
    report = analyse(spec, args.out)
    path = save_report(report, args.out)
    print(format_report(report), file=sys.stderr)
    print(f"wrote {path}", file=sys.stderr)
    return (report, 1) if run["failed"] else report
