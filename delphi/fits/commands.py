"""The `delphi fit` and `delphi predict` command line, one concept: argument parsing and output only.

`delphi fit isoflop|envelope|parametric|vpnls|frontier|moe|backtest|coverage` and `delphi predict`:
each runner reads its flags, calls the library modules of `delphi.fits` (imported lazily, so that
`delphi --help` does not load pandas and scipy) and prints or writes what they return. It stays one
module because only a command module may import lazily; the work lives in the modules it calls.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from delphi.cli import (
    add_column_options,
    add_json_flag,
    add_table_options,
    nonnegative_int,
    output_path,
    positive_float,
    positive_int,
    table_load_kwargs,
    table_options,
)
from delphi.errors import DelphiError
from delphi.fits.e_prior import forecast_at_refits, parse_pinned, parse_prior, prior_of
from delphi.io import atomic_write_json
from delphi.path_policy import check_output_file

# delphi.fits.probes.PROBE_CARRIES, spelled out so that building the parser (every `delphi --help`)
# does not import pandas and scipy; tests/test_cli_help.py checks they agree.
PROBE_CARRIES = ("linear", "local_slope")
BEYOND_DEFAULT_METHODS = (
    "isoflop",
    "vpnls",
    "parametric",
    "frontier",
    "asymptotic",
)  # delphi.fits.beyond.BEYOND_METHODS
METHODS = ("isoflop", "envelope", "parametric", "vpnls", "frontier", "asymptotic", "moe")
E_LAWS = (
    "frontier",
    "asymptotic",
    "parametric",
    "vpnls",
)  # the laws with an irreducible loss E a lab may pin or give a prior
# delphi.fits.bootstrap.MIN_BOOTSTRAP_FOR_INTERVAL (the reason is there), spelled out so that building
# the parser does not import numpy and pandas; tests/test_hostile_configs.py checks they agree.
MIN_BOOTSTRAP_FOR_INTERVAL = 20
HELP = {
    "isoflop": "Approach 2: per-budget parabolas, N* ~ C^a, D* ~ C^b, L*(C)",
    "envelope": "Approach 1: lower envelope of loss against compute",
    "parametric": "Approach 3: L = E + A/N^alpha + B/D^beta, Huber on log loss, L-BFGS-B from a grid",
    "vpnls": "L = E + A/N^alpha + B/D^beta by variable projection (NNLS inside, Nelder-Mead outside)",
    "frontier": "compute frontier L*(C) = E + A C^-gamma (E free, fixed or profiled)",
    "asymptotic": "asymptotic frontier law L*(C) = E + A C^-alpha through the isoFLOP vertices, E free, "
    "weighted by each vertex's uncertainty (delta-method SE + seed noise)",
    "moe": "MoE law in active params with a granularity or expert-count term (Krajewski et al. 2024)",
}


def add_commands(subparsers: argparse._SubParsersAction) -> None:

    fit = subparsers.add_parser("fit", help="fit scaling laws to a results table")
    fit_sub = fit.add_subparsers(dest="fit_command", metavar="METHOD", parser_class=type(fit))
    fit_sub.required = True
    for method in METHODS + ("backtest",):
        sub = fit_sub.add_parser(method, help=HELP.get(method, "fit below a cut, predict the budgets above"))
        sub.add_argument("results", help="results table (CSV; JSON/JSONL/Parquet by suffix; Parquet needs pyarrow)")
        add_table_options(sub)
        if method == "backtest":
            sub.add_argument(
                "--method",
                choices=METHODS,
                nargs="+",
                default=None,
                help="law(s) to backtest (default vpnls; --beyond: isoflop vpnls parametric frontier asymptotic)",
            )
            group = sub.add_mutually_exclusive_group()
            group.add_argument("--holdout", type=positive_int, default=1, help="hold out the top K budgets (default 1)")
            group.add_argument("--cut", type=positive_float, help="train on budgets below this compute")
            group.add_argument(
                "--all-holdouts",
                action="store_true",
                help="every budget above the third held out in turn (train on all lower budgets), "
                "every method: mean |error| and 90%% coverage",
            )
            group.add_argument(
                "--probes",
                type=positive_int,
                metavar="P",
                help="backtest the probe-trend correction: at every cut the next P budgets are probes and "
                "the law x (1 + its error trend at them) predicts the budgets beyond",
            )
            group.add_argument(
                "--beyond",
                action="store_true",
                help="for each k >= 3 fit the first k budgets, predict every higher budget's best loss: "
                "error, 50%%/90%% coverage and extrapolation factor, by method and bin (1-3x, 3-10x, "
                "10-30x, >30x), before and after the calibrated model-error term",
            )
            sub.add_argument(
                "--source-col",
                nargs="+",
                metavar="COL",
                help="--beyond: one sweep per distinct value of these columns (e.g. source dataset condition)",
            )
            cal = sub.add_mutually_exclusive_group()
            cal.add_argument(
                "--calibration",
                type=Path,
                metavar="FILE",
                help="calibration file (default: the committed delphi/fits/data/beyond_calibration.json): "
                "each held-out budget's calibrated 90%% interval beside the law's own (not --probes)",
            )
            cal.add_argument(
                "--no-calibration",
                action="store_true",
                help="the law's own intervals only, as before calibrated intervals (--beyond: score the "
                "fit-only intervals only)",
            )
            cal.add_argument(
                "--loso",
                action="store_true",
                help="--beyond with >= 3 sources: calibrate on the table's own sources, leave one source out",
            )
            sub.add_argument(
                "--min-train-budgets",
                type=positive_int,
                default=3,
                metavar="K",
                help="--all-holdouts, --probes: smallest number of training budgets (default 3)",
            )
            sub.add_argument(
                "--tolerance",
                type=positive_float,
                default=0.03,
                help="--probes: a correction counts as tested when gate probes' test passes at this tolerance (default 0.03)",
            )
            sub.add_argument(
                "--probe-carry",
                choices=PROBE_CARRIES,
                default="linear",
                help="--probes: carry the law's error at the probes by least squares linear in log C through "
                "all of them (default) or along the line through the two furthest",
            )
        _add_method_options(sub, method)
        sub.add_argument(
            "--bootstrap",
            type=nonnegative_int,
            default=0,
            metavar="N",
            help=f"bootstrap refits for the 90%% intervals: 0 (none) or at least {MIN_BOOTSTRAP_FOR_INTERVAL}",
        )
        sub.add_argument("--seed", type=nonnegative_int, default=0, help="bootstrap seed (an integer >= 0)")
        sub.add_argument(
            "--workers",
            type=positive_int,
            default=None,
            help="bootstrap processes (default and most: the usable cores)",
        )
        sub.add_argument("--out", type=output_path, help="write the fit JSON here (atomically)")
        sub.add_argument(
            "--force",
            action="store_true",
            help="replace --out even if it is not a file this command wrote (never one of its inputs)",
        )
        add_json_flag(sub)
        sub.set_defaults(func=run_fit if method != "backtest" else run_backtest, fit_method=method)

    about = (
        "empirical 50%% and 90%% coverage of Delphi's intervals, from committed files: the default study's seeds, "
        "the public sweeps (leave-one-source-out, by extrapolation factor), every sealed outcome"
    )
    cov = fit_sub.add_parser("coverage", help=about, description=about.replace("%%", "%") + " (docs/cli.md)")
    cov.add_argument(
        "--root",
        type=Path,
        default=None,
        metavar="DIR",
        help="the repository whose committed files are counted (default: this checkout)",
    )
    cov.add_argument(
        "--summary",
        type=Path,
        metavar="CSV",
        help="default-study summary (default ROOT/benchmarks/default_study/summary.csv)",
    )
    cov.add_argument(
        "--edition",
        metavar="E",
        help="the default study's edition to count (default: the newest plain-numbered "
        "edition with outcomes; 5b, 5c are variant rounds)",
    )
    cov.add_argument(
        "--beyond-rows",
        type=Path,
        metavar="CSV",
        help="leave-one-source-out predictions on the public sweeps (default "
        "ROOT/benchmarks/results/beyond/public_rows.csv)",
    )
    cov.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="calibration whose LOSO table the rows are checked against (default "
        "ROOT/delphi/fits/data/beyond_calibration.json)",
    )
    cov.add_argument(
        "--preregistrations",
        type=Path,
        metavar="DIR",
        help="sealed preregistrations and outcomes (default ROOT/preregistrations)",
    )
    cov.add_argument(
        "--by-method", action="store_true", help="public sweeps: one pair of rows per law instead of the laws pooled"
    )
    add_json_flag(cov)
    cov.set_defaults(func=run_coverage, fit_method="coverage")

    pred = subparsers.add_parser("predict", help="predict loss / N* / D* from a fit JSON")
    pred.add_argument("fit", type=Path, help="FIT.json written by delphi fit")
    pred.add_argument("--compute", type=positive_float, nargs="+", help="compute budget(s) in FLOPs")
    pred.add_argument("--params", type=positive_float, help="N (with --tokens), for laws in N and D")
    pred.add_argument("--tokens", type=positive_float, help="D (with --params)")
    pred.add_argument("--config", type=Path, help="a train config (hero): predict at its N, D and FLOPs")
    pred.add_argument("--granularity", type=positive_float, help="MoE law: granularity d_ff/d_expert")
    pred.add_argument("--experts", type=positive_float, help="MoE law: routed expert count")
    pred.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="calibration of extrapolation (default: the committed public-sweep calibration)",
    )
    pred.add_argument(
        "--no-calibration",
        action="store_true",
        help="the law's own interval only, as before calibrated intervals were shown",
    )
    pred.add_argument(
        "--results",
        type=Path,
        metavar="TABLE",
        help="the fit's table, to compare the seal's cross-check laws on (default: the table the fit records, "
        "where it is still there unchanged); read with the column flags below",
    )
    add_column_options(pred)
    pred.add_argument(
        "--tolerance",
        type=positive_float,
        default=0.01,
        help="laws further apart than this (relative) are reported as disagreeing (default 0.01, a seal's)",
    )
    add_json_flag(pred)
    pred.set_defaults(func=run_predict)


def _add_method_options(sub: argparse.ArgumentParser, method: str) -> None:

    if method in ("isoflop", "backtest"):
        sub.add_argument("--robust", action="store_true", help="isoflop: Huber instead of least-squares parabolas")
    if method in ("parametric", "backtest"):
        sub.add_argument(
            "--full-grid", action="store_true", help="parametric: L-BFGS-B from all 4500 grid starts (slow)"
        )
    if method in ("asymptotic", "parametric", "vpnls"):
        sub.add_argument(
            "--target-compute",
            type=positive_float,
            nargs="+",
            help="compute(s) at which the forecast under an E prior is shown (default 10x the largest budget)",
        )
    if method in ("asymptotic", "parametric", "vpnls"):
        sub.add_argument(
            "--E",
            dest="e_mode",
            default="free",
            metavar="free|NUMBER",
            help="the irreducible loss E: free (default) or a number (pinned, nats)",
        )
    if method in ("frontier", "backtest"):
        sub.add_argument(
            "--E",
            dest="e_mode",
            default="free",
            metavar="free|profile|NUMBER",
            help="the irreducible loss E: free, profile (frontier only) or a number (pinned, nats)"
            + ("; every law with an E" if method == "backtest" else ""),
        )
        sub.add_argument(
            "--points",
            choices=("min", "vertex"),
            default="min",
            help="frontier: best observed loss or parabola vertex per budget",
        )
        sub.add_argument(
            "--target-compute", type=positive_float, nargs="+", help="frontier: compute(s) for the E-sensitivity table"
        )
    if method in E_LAWS + ("backtest",):
        sub.add_argument(
            "--E-prior",
            dest="e_prior",
            metavar="MEAN,SD",
            help="a Gaussian prior on the irreducible loss E (nats), e.g. 1.6,0.1: the maximum a posteriori fit, "
            "and the forecast refitted at E -+ SD" + ("; every law with an E" if method == "backtest" else ""),
        )
    if method in ("moe", "backtest"):
        sub.add_argument(
            "--term", choices=("granularity", "experts"), default="granularity", help="moe: the expert term"
        )


@contextlib.contextmanager
def _naming_table(table) -> Iterator[None]:
    """A fit's DelphiError about the table ("1 compute budget", a cut leaving no rows) with the
    table's file in front, as every input error names its file."""
    source = table.attrs.get("source") or "table"
    try:
        yield
    except DelphiError as e:
        if str(e).startswith(str(source)):
            raise
        raise DelphiError(f"{source}: {e}") from None


def _load(args: argparse.Namespace, source: Any = None, query: Any = "from-args"):
    from delphi.fits.data import load_results  # lazy: the fits import pandas and scipy

    kwargs = table_load_kwargs(args)
    if query != "from-args":
        kwargs["options"] = dataclasses.replace(kwargs["options"], query=query)
    return load_results(args.results if source is None else source, **kwargs)


def e_prior_of(args: argparse.Namespace, method: str):
    """The lab's E for `method` from --E and --E-prior (delphi.fits.e_prior): None (E free, or a law
    without an E: `backtest` says so once), pinned, or a Gaussian prior. DelphiError (exit 2) for both
    flags at once or a value that is not one."""

    e_mode, e_prior = getattr(args, "e_mode", "free"), getattr(args, "e_prior", None)
    if e_prior is not None and e_mode != "free":
        raise DelphiError(
            f"--E {e_mode} and --E-prior {e_prior} contradict each other: pin E or give it a prior, not both"
        )
    if method not in E_LAWS:
        return None
    if e_prior is not None:
        return parse_prior(e_prior)
    if e_mode == "profile":
        if method != "frontier":
            raise DelphiError(f"--E profile: only the frontier law profiles E (not {method}); give free or a number")
        return None
    return parse_pinned(e_mode)


def _fit_function(args: argparse.Namespace, method: str):
    from delphi.fits import FITTERS  # lazy: the fits import pandas and scipy

    options: dict[str, Any] = {"n_bootstrap": args.bootstrap, "seed": args.seed, "workers": args.workers}
    _check_bootstrap(args)
    prior = e_prior_of(args, method)
    if method in ("parametric", "vpnls", "asymptotic") or method == "frontier" and getattr(args, "e_prior", None):
        options["E_prior"] = prior
    if method == "isoflop":
        options["robust"] = args.robust
    elif method == "parametric":
        if args.full_grid:
            options["top_starts"] = None
    elif method == "frontier":
        options.update(
            E="free" if options.get("E_prior") else args.e_mode, points=args.points, target_compute=args.target_compute
        )
    elif method == "asymptotic":
        options["target_compute"] = getattr(args, "target_compute", None)
    if method in ("frontier", "asymptotic") and getattr(args, "beyond", False):
        options["with_sensitivity"] = False  # the E profile costs 41 refits per fit; --beyond reads the point only
    elif method == "moe":
        options["term"] = args.term
    return partial(FITTERS[method], **options)


def _command(args: argparse.Namespace) -> str:
    """The command that writes --out, as its file says (delphi.io's output policy)."""
    return f"fit {args.fit_method}"


def _check_bootstrap(args: argparse.Namespace, rows: int | None = None) -> None:
    """--bootstrap is 0 (no interval) or at least MIN_BOOTSTRAP_FOR_INTERVAL; with the table's
    `rows`, its replicates must fit in the memory available now."""
    if args.bootstrap < 0:
        raise DelphiError(f"--bootstrap {args.bootstrap}: expected >= 0")
    if 0 < args.bootstrap < MIN_BOOTSTRAP_FOR_INTERVAL:
        raise DelphiError(
            f"--bootstrap {args.bootstrap}: too few replicates for a 90% interval (each 5% tail needs a draw); "
            f"use 0 for no interval or at least {MIN_BOOTSTRAP_FOR_INTERVAL}"
        )
    if rows is not None and args.bootstrap > 0:
        from delphi.fits.bootstrap import check_bootstrap_memory  # lazy: the fits import pandas and scipy

        check_bootstrap_memory(args.bootstrap, rows, flag="--bootstrap")


def _check_out(args: argparse.Namespace) -> None:

    _check_bootstrap(args)  # before any work: a bad --bootstrap must not cost a table's loading
    if args.out is not None:  # before any work: a bad --out must not cost a bootstrap
        check_output_file(
            args.out, inputs=(args.results, getattr(args, "family", None)), command=_command(args), force=args.force
        )


def run_fit(args: argparse.Namespace) -> dict[str, Any]:

    _check_out(args)
    e_prior_of(args, args.fit_method)  # a bad --E / --E-prior before the table is read
    table = _load(args)
    _check_bootstrap(args, rows=len(table))
    with _naming_table(table):
        fit = _fit_function(args, args.fit_method)(table)
    data = fit.to_json()
    print(fit.summary(), file=sys.stderr)
    decided = prior_forecasts(fit, getattr(args, "target_compute", None))
    if decided:
        data["E_prior_forecasts"] = decided
        for row in decided:
            print(f"  at C={row['compute']:.3g} FLOPs: {row['text']}", file=sys.stderr)
    if args.out:
        atomic_write_json(args.out, data, written_by=_command(args))
        print(f"wrote {args.out}", file=sys.stderr)
    if data.get("bootstrap"):  # keep stdout small: the draws are in the file
        data = dict(data, bootstrap={"n": data["bootstrap"]["n"]})
    return data


def prior_forecasts(fit, computes: list[float] | None = None) -> list[dict[str, Any]]:
    """How much of the forecast a fit's E prior decides (delphi.fits.e_prior.forecast_at_refits) at
    each of `computes` (default: 10x the largest fitted budget); [] for a fit without a prior."""

    if prior_of(fit) is None:
        return []
    if not computes:
        computes = [10 * fit.fitted_compute[1]] if fit.fitted_compute else []
    rows = []
    for compute in computes:
        decided = forecast_at_refits(fit, lambda f, c=compute: f.predict(compute=float(c))["loss"])
        if decided is not None:
            rows.append({"compute": float(compute), **decided})
    return rows


def run_backtest(args: argparse.Namespace) -> dict[str, Any]:
    _check_out(args)
    if args.method is None:
        args.method = list(BEYOND_DEFAULT_METHODS) if args.beyond else ["vpnls"]
    for method in args.method:  # a bad --E / --E-prior before the table is read
        e_prior_of(args, method)
    no_e = [m for m in args.method if m not in E_LAWS]
    if no_e and (args.e_prior is not None or args.e_mode != "free"):
        print(
            f"note: --E/--E-prior applies to the laws with an E ({', '.join(m for m in args.method if m in E_LAWS) or 'none given'}); "
            f"{', '.join(no_e)} {'has' if len(no_e) == 1 else 'have'} none",
            file=sys.stderr,
        )
    if args.beyond:
        return _beyond(args)
    for flag in ("source_col", "loso"):
        if getattr(args, flag):
            raise DelphiError(f"backtest: --{flag.replace('_', '-')} goes with --beyond")
    if args.probes and args.calibration:
        raise DelphiError(
            "backtest --probes: --calibration goes with the default backtest, --all-holdouts or --beyond "
            "(--probes scores the probe correction, not calibrated intervals)"
        )
    calibration = None
    if not (args.no_calibration or args.probes):  # checked (schema, numbers, source hash) before any fit
        from delphi.fits.calibration_file import load_checked_calibration  # lazy: the fits import pandas and scipy

        calibration = load_checked_calibration(args.calibration)
    table = _load(args)
    with _naming_table(table):
        return _backtest(args, table, calibration)


def _fits_seen(fit_fn, seen: dict[str, tuple[str, str]], method: str):
    """`fit_fn`, noting the (kind, method) of the fits it makes: the calibration entry is the fit's."""

    def fit(table):
        result = fit_fn(table)
        seen[method] = (result.kind, result.method)
        return result

    return fit


def _backtest(args: argparse.Namespace, table, calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    from delphi.fits.backtest import backtest  # lazy: the fits import pandas and scipy

    if args.all_holdouts:
        return _all_holdouts(args, table, calibration)
    if args.probes:
        return _probe_holdouts(args, table)
    if len(args.method) > 1:
        raise DelphiError("backtest: several --method values need --all-holdouts (or run one method at a time)")
    if calibration is not None:
        return _calibrated_backtest(args, table, calibration)
    result = backtest(table, _fit_function(args, args.method[0]), cut=args.cut, holdout=args.holdout)
    for b in result["budgets"]:
        ci = b["loss_interval_90"]
        ci_text = f"  90% [{ci[0]:.4f}, {ci[1]:.4f}] covered={b['covered_90']}" if ci else ""
        print(
            f"budget {b['budget']:.3g}: observed {b['observed_best_loss']:.4f}, predicted "
            f"{b['predicted_loss']:.4f} ({100 * b['rel_error']:+.2f}%){ci_text}",
            file=sys.stderr,
        )
    print(
        f"mean |relative error| {100 * result['mean_abs_rel_error']:.2f}% (allocation {result['allocation']})",
        file=sys.stderr,
    )
    if args.out:
        atomic_write_json(args.out, result, written_by=_command(args))
    return result


def _calibrated_backtest(args: argparse.Namespace, table, calibration: dict[str, Any]) -> dict[str, Any]:
    """The default backtest with calibrated intervals: per held-out budget its extrapolation factor, the
    law's prediction and own interval (uncalibrated) and the calibrated interval beside them
    (`calibration.calibrate_backtest`), then both intervals' coverage."""
    from delphi.fits import calibration as cal  # lazy: the fits import pandas and scipy
    from delphi.fits.backtest import backtest  # lazy: the fits import pandas and scipy

    method, seen = args.method[0], {}
    result = backtest(table, _fits_seen(_fit_function(args, method), seen, method), cut=args.cut, holdout=args.holdout)
    result = cal.calibrate_backtest(
        result, calibration, method=method, kind=seen[method][0], fit_method=seen[method][1]
    )
    result = with_best_points(result, table, calibration)
    print(_calibration_line(result["calibration"]), file=sys.stderr)
    top = result["train_budgets"][-1]
    for b in result["budgets"]:
        c = b["calibrated"]
        ci = b["loss_interval_90"]
        own = f"[{ci[0]:.4f}, {ci[1]:.4f}] covered={b['covered_90']}" if ci else "none"
        print(
            f"budget {b['budget']:.3g} ({b['extrapolation']:.3g}x the largest fitted budget {top:.3g}): observed "
            f"{b['observed_best_loss']:.4f}, predicted {b['predicted_loss']:.4f} (the law's point, {100 * b['rel_error']:+.2f}%)\n"
            f"  law's own 90% (uncalibrated): {own}\n"
            f"  {cal.describe_calibrated(c)}" + (f" covered={c['covered_90']}" if c["applied"] else ""),
            file=sys.stderr,
        )
        best = b["best_point"]
        print(
            f"  the point that decides: {best['loss']:.4f} ({best['decides']}, {100 * best['rel_error']:+.2f}%)",
            file=sys.stderr,
        )
    print(
        f"mean |relative error| {100 * result['mean_abs_rel_error']:.2f}% (allocation {result['allocation']})",
        file=sys.stderr,
    )
    print(_coverage_line(method, result["interval_coverage"][method]), file=sys.stderr)
    print(_best_point_line(result["best_point"]), file=sys.stderr)
    if args.out:
        atomic_write_json(args.out, result, written_by=_command(args))
    return result


def with_best_points(
    result: dict[str, Any], table, calibration: dict[str, Any], key: str = "budgets"
) -> dict[str, Any]:
    from delphi.fits.best_point import with_best_points as add  # lazy: the fits import pandas and scipy

    return add(result, table, calibration, key)


def _best_point_line(best: dict[str, Any]) -> str:
    pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    return (
        f"the point that decides: {best['why']}; mean |error| {pct(best['mean_abs_rel_error'])} "
        f"(the law's own point: {pct(best['law_mean_abs_rel_error'])})"
    )


def _calibration_line(provenance: dict[str, Any]) -> str:
    check = provenance.get("source_check") or {}
    sources = "; ".join(
        f"{i['path']} sha256 {i['sha256'][:12]} " + ("verified" if i["verified"] else "not found here, not checked")
        for i in check.get("inputs", [])
    )
    line = f"calibration: {provenance['path']}, sha256 {provenance['sha256'][:12]} (made from {sources})"
    if provenance.get("table_is_calibration_source"):
        line += (
            "\nnote: this table's file is the data the calibration was made from: where its sweep is one of the "
            "calibration's sources, the calibrated coverage here is in-sample, not a test"
        )
    return line


def _coverage_line(method: str, c: dict[str, Any]) -> str:
    from delphi.fits.calibration import NOT_CALIBRATED_WHY  # lazy: the fits import pandas and scipy

    own, cal = c["uncalibrated_90"], c["calibrated_90"]
    left = ", ".join(f"{n} {NOT_CALIBRATED_WHY.get(why, why)}" for why, n in sorted(cal["not_calibrated"].items()))
    return (
        f"{method}: 90% coverage of {c['held_out']} held-out point(s): law's own interval (uncalibrated) covered "
        f"{own['covered']} of {own['with_interval']}, calibrated interval covered {cal['covered']} of "
        f"{cal['with_interval']}" + (f" (no calibrated interval: {left})" if left else "")
    )


def _all_holdouts(args: argparse.Namespace, table, calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    from delphi.fits.backtest import all_holdouts  # lazy: the fits import pandas and scipy

    seen: dict[str, tuple[str, str]] = {}
    fit_fns = {m: _fit_function(args, m) for m in args.method}
    if calibration is not None:
        fit_fns = {m: _fits_seen(fn, seen, m) for m, fn in fit_fns.items()}
    result = all_holdouts(table, fit_fns, min_train_budgets=args.min_train_budgets)
    if calibration is not None:
        from delphi.fits.calibration import calibrate_all_holdouts  # lazy: the fits import pandas and scipy

        result = with_best_points(calibrate_all_holdouts(result, calibration, seen), table, calibration, key="rows")
        print(_calibration_line(result["calibration"]), file=sys.stderr)
        print(_best_point_line(result["best_point"]), file=sys.stderr)
    pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    for method, s in result["summary"].items():
        print(
            f"{method}: {s['n']} held-out points ({s['failed_fits']} failed fits): mean |error| "
            f"{pct(s['mean_abs_rel_error'])}, 90% coverage {pct(s['coverage_90'])}; one step ahead: "
            f"mean |error| {pct(s['one_step_mean_abs_rel_error'])}, coverage {pct(s['one_step_coverage_90'])}",
            file=sys.stderr,
        )
        if calibration is not None:
            print("  " + _coverage_line(method, result["interval_coverage"][method]), file=sys.stderr)
    if args.out:
        atomic_write_json(args.out, result, written_by=_command(args))
    return result


def _beyond(args: argparse.Namespace) -> dict[str, Any]:
    """`backtest --beyond`: every input is checked (calibration schema, sources, budgets) before any fit,
    and the result is written only at the end."""
    import time

    import pandas as pd

    from delphi.fits.beyond import (
        beyond_rows,
        bin_table,
        check_beyond_table,
        markdown_table,
        split_sources,
        sweep_features,
    )  # lazy: the fits import pandas and scipy
    from delphi.fits.calibration_file import (  # lazy: the fits import pandas and scipy
        calibration_provenance,
        load_checked_calibration,
    )
    from delphi.fits.calibration_model import MODEL, apply_calibration, loso  # lazy: the fits import pandas and scipy
    from delphi.fits.table_files import read_table  # lazy: the fits import pandas and scipy
    from delphi.query import select_rows  # lazy: pandas

    calibration = None if (args.no_calibration or args.loso) else load_checked_calibration(args.calibration)
    if args.source_col:
        where, raw, _ = read_table(args.results)
        if args.query:
            try:
                raw = select_rows(raw, args.query)
            except DelphiError as e:
                raise DelphiError(f"{where}: {e}") from None
        loader = lambda g: _load(args, g, query=None)  # noqa: E731
        sweeps = split_sources(raw, args.source_col, loader)
    else:
        sweeps = [(str(args.results), _load(args))]
    if args.loso and len(sweeps) < 3:
        raise DelphiError(f"backtest --beyond --loso: {len(sweeps)} source(s) from --source-col; need >= 3")
    sweeps = [(name, check_beyond_table(table, f"backtest --beyond: source {name!r}")) for name, table in sweeps]
    fit_fns = {m: _fit_function(args, m) for m in args.method}
    start = time.perf_counter()
    rows, failed = [], []
    for name, table in sweeps:
        for r in beyond_rows(table, fit_fns, source=name):
            (failed if "error" in r else rows).append(r)
    frame = pd.DataFrame(rows)
    if args.loso:
        scored = loso(frame)
        provenance: dict[str, Any] = {
            "applied": True,
            "mode": "leave-one-source-out on this table's sources",
            "model": MODEL,
        }
    elif calibration is not None:
        scored = apply_calibration(frame, {m: c for m, c in calibration["methods_parsed"].items() if m in args.method})
        provenance = calibration_provenance(calibration)
        overlap = sorted({name for name, _ in sweeps} & set(calibration["sources"]))
        if overlap:
            provenance["in_sample_sources"] = overlap
            print(
                f"note: {', '.join(overlap)} calibrated the file itself: their calibrated rows are in-sample "
                f"(use --loso for out-of-sample)",
                file=sys.stderr,
            )
        missing = [m for m in args.method if m not in calibration["methods_parsed"]]
        if missing:
            provenance["uncalibrated_methods"] = missing
    else:
        scored, provenance = frame, {"applied": False}
    elapsed = time.perf_counter() - start
    before = bin_table(scored)
    after = bin_table(scored, "cal_") if provenance["applied"] else before.iloc[:0]
    print("before calibration (fit-only intervals):\n" + markdown_table(before), file=sys.stderr)
    if provenance["applied"]:
        print("after calibration:\n" + markdown_table(after), file=sys.stderr)
    for r in failed:
        print(f"failed fit: {r['source']} {r['method']} below {r['cut']:g}: {r['error']}", file=sys.stderr)
    print(f"{len(scored)} predictions from {len(sweeps)} sweep(s) in {elapsed:.1f} s", file=sys.stderr)
    result = {
        "kind": "backtest_beyond",
        "methods": list(args.method),
        "runtime_s": elapsed,
        "sources": {name: sweep_features(table) for name, table in sweeps},
        "calibration": provenance,
        "bins": before.to_dict("records"),
        "bins_calibrated": after.to_dict("records"),
        "rows": scored.astype(object).where(scored.notna(), None).to_dict("records"),
        "failed_fits": failed,
    }
    if args.out:
        atomic_write_json(args.out, result, written_by=_command(args))
    return result


def _probe_holdouts(args: argparse.Namespace, table) -> dict[str, Any]:
    from delphi.fits.backtest import probe_holdouts  # lazy: the fits import pandas and scipy

    if len(args.method) > 1:
        raise DelphiError("backtest --probes: one --method at a time")
    result = probe_holdouts(
        table,
        _fit_function(args, args.method[0]),
        probes=args.probes,
        min_train_budgets=args.min_train_budgets,
        tolerance=args.tolerance,
        carry=args.probe_carry,
    )
    pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    for label, s in result["summary"].items():
        print(
            f"{args.method[0]}, {label} ({s['n']} points beyond {args.probes} probes, {args.probe_carry}): mean |error| law "
            f"{pct(s['law_mean_abs_rel_error'])}, corrected {pct(s['corrected_mean_abs_rel_error'])}; 90% coverage "
            f"law {pct(s['law_coverage_90'])}, corrected {pct(s['corrected_coverage_90'])}",
            file=sys.stderr,
        )
    if args.out:
        atomic_write_json(args.out, result, written_by=_command(args))
    return result


def run_coverage(args: argparse.Namespace) -> dict[str, Any]:
    """`delphi fit coverage`: the table on stderr (markdown, then its notes); --json: rows, notes, markdown."""
    from delphi.fits.coverage import REPO_ROOT, coverage_table  # lazy: the fits import pandas and scipy

    root = args.root if args.root is not None else REPO_ROOT
    if args.root is not None and not Path(args.root).is_dir():
        raise DelphiError(f"--root {args.root}: not a directory")
    result = coverage_table(
        root,
        summary=args.summary,
        beyond_rows=args.beyond_rows,
        calibration=args.calibration,
        preregistrations=args.preregistrations,
        edition=args.edition,
        by_method=args.by_method,
    )
    print(result["markdown"], file=sys.stderr)
    if result["notes"]:
        print("\nNotes:\n" + "\n".join(f"- {n}" for n in result["notes"]), file=sys.stderr)
    return result


def run_predict(args: argparse.Namespace) -> dict[str, Any]:
    """`delphi predict`: per prediction, the point that decides first (the calibrated centre where the
    evidence says the calibration transfers, else the law's own; delphi.fits.best_point), then the
    law's own numbers, its extrapolation, both intervals, how much a lab's E prior decides, and whether
    the seal's cross-check laws agree on the fit's table (delphi.fits.prediction_checks). A fitted
    parameter on a bound is a warning."""
    from delphi.fits import prediction_checks as pc  # lazy: the fits import pandas and scipy
    from delphi.fits.calibration import (  # lazy: the fits import pandas and scipy
        calibrate_point,
        calibration_key,
        describe_calibrated,
    )
    from delphi.fits.calibration_file import load_checked_calibration  # lazy: the fits import pandas and scipy
    from delphi.fits.results import check_sizing_exponents, load_fit, to_plain  # lazy: the fits import pandas and scipy

    if args.no_calibration and args.calibration is not None:
        raise DelphiError("predict: --no-calibration and --calibration FILE contradict each other; give one")
    reading = table_options(args)
    if args.results is None and not reading.is_default:
        raise DelphiError("predict: the column mapping and --query read the fit's table: give --results TABLE")
    calibration = None if args.no_calibration else load_checked_calibration(args.calibration)
    fit = load_fit(args.fit)
    check_sizing_exponents(fit, str(args.fit))
    terms = {k: getattr(args, k) for k in ("granularity", "experts") if getattr(args, k) is not None}
    queries: list[dict[str, Any]] = []
    if args.compute:
        queries += [{"compute": c} for c in args.compute]
    if args.params is not None or args.tokens is not None:
        if args.params is None or args.tokens is None:
            raise DelphiError("predict: --params and --tokens go together")
        queries.append({"params": args.params, "tokens": args.tokens})
    if not queries and not args.config:
        raise DelphiError("predict: give --compute C, --params N --tokens D, or --config HERO.yaml")
    table, not_compared = pc.fit_table(fit, args.fit, args.results, reading)
    predictions = []
    if args.config:
        predictions.append(to_plain(pc.config_prediction(fit, args.config, terms)))
    predictions += [to_plain({**q, **fit.predict(**q, **terms)}) for q in queries]
    warnings = []
    bound = pc.bound_warning(fit)
    if bound:
        warnings.append(bound)
        print(f"warning: {bound}", file=sys.stderr)
    for p in predictions:
        p["extrapolation"] = pc.extrapolation(fit, p)
        factor = (p["extrapolation"] or {}).get("factor_over_largest")
        if calibration is not None and factor is not None and factor > 1 and p.get("loss") is not None:
            # Beyond the fitted budgets the law's own interval covers far less than it says: the
            # calibrated one sits beside it.
            p["calibrated"] = calibrate_point(
                calibration_key(fit.kind, fit.method),
                p["loss"],
                p.get("loss_interval_90"),
                factor,
                calibration,
                fit_label=f"a {fit.kind} fit by {fit.method}",
            )
        if p.get("loss") is not None:
            p["point"] = pc.point_choice(fit, p.get("calibrated"), calibration)
            p["loss_is"] = (
                "the law's own point (loss_interval_90: the law's own interval, uncalibrated); point: the one that decides"
            )
            law_loss = p["loss"]
            print(
                "point: "
                + (
                    f"{p['point']['loss']:.4f}, {p['point']['why']}; the law's own point {law_loss:.4f}"
                    if "loss" in p["point"]
                    else f"{law_loss:.4f}, {p['point']['why']}"
                ),
                file=sys.stderr,
            )
        shown = {
            k: v for k, v in p.items() if not isinstance(v, (list, dict)) and k not in ("extrapolation", "loss_is")
        }
        print(
            ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()), file=sys.stderr
        )
        print(f"  {pc.extrapolation_text(p['extrapolation'])}", file=sys.stderr)
        if "calibrated" in p:
            own = p.get("loss_interval_90")
            print(
                "  law's own 90% (uncalibrated): "
                + (f"[{own[0]:.4f}, {own[1]:.4f}]" if own else "none")
                + f"; {describe_calibrated(p['calibrated'])}",
                file=sys.stderr,
            )
        if p["extrapolation"] and p["extrapolation"]["warning"]:
            warnings.append(p["extrapolation"]["warning"])
            print(f"warning: {p['extrapolation']['warning']}", file=sys.stderr)
        if p.get("loss") is None:
            continue
        ask = pc.question(fit, p, terms)
        decided = forecast_at_refits(fit, ask)
        if decided is not None:
            p["E_prior"] = decided
            print(f"  E prior: {decided['text']}", file=sys.stderr)
        if table is None:
            p["laws"] = {"compared": False, "why": not_compared}
            print(f"  laws not compared: {not_compared}", file=sys.stderr)
            continue
        calibrate = None
        if "loss" in p["point"]:
            calibrate = lambda law, loss, f=factor: pc.calibrated_loss(law, loss, f, calibration)  # noqa: E731
        p["laws"] = pc.law_comparison(fit, table, ask, args.tolerance, calibrate)
        print(f"  {p['laws']['text']}", file=sys.stderr)
        if p["laws"]["disagree"]:
            warnings.append(p["laws"]["text"])
    result = predictions[0] if len(predictions) == 1 else {"predictions": predictions}
    return {"fit": str(args.fit), "kind": fit.kind, "method": fit.method, **result, "warnings": warnings}
