"""`delphi fit isoflop|envelope|parametric|vpnls|frontier|moe|backtest` and `delphi predict`."""

from __future__ import annotations

import argparse
import contextlib
import sys
from functools import partial
from pathlib import Path
from typing import Any, Iterator

from delphi.errors import DelphiError

# delphi.fits.allocation.PARAM_CONVENTIONS, spelled out so that building the parser (every
# `delphi --help`) does not import pandas and scipy; tests/test_cli_help.py checks they agree.
PARAM_CONVENTIONS = ("nonembedding", "active", "fpt6")
PROBE_CARRIES = ("linear", "local_slope")  # delphi.fits.backtest.PROBE_CARRIES, likewise
COLUMN_OPTIONS = ("params", "tokens", "flops", "loss", "budget", "run_id", "experts", "granularity")
METHODS = ("isoflop", "envelope", "parametric", "vpnls", "frontier", "moe")
HELP = {
    "isoflop": "Approach 2: per-budget parabolas, N* ~ C^a, D* ~ C^b, L*(C)",
    "envelope": "Approach 1: lower envelope of loss against compute",
    "parametric": "Approach 3: L = E + A/N^alpha + B/D^beta, Huber on log loss, L-BFGS-B from a grid",
    "vpnls": "L = E + A/N^alpha + B/D^beta by variable projection (NNLS inside, Nelder-Mead outside)",
    "frontier": "compute frontier L*(C) = E + A C^-gamma (E free, fixed or profiled)",
    "moe": "MoE law in active params with a granularity or expert-count term (Krajewski et al. 2024)",
}


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    from delphi.cli import add_json_flag, nonnegative_int, output_path, positive_float, positive_int

    fit = subparsers.add_parser("fit", help="fit scaling laws to a results table")
    fit_sub = fit.add_subparsers(dest="fit_command", metavar="METHOD", parser_class=type(fit))
    fit_sub.required = True
    for method in METHODS + ("backtest",):
        sub = fit_sub.add_parser(method, help=HELP.get(method, "fit below a cut, predict the budgets above"))
        sub.add_argument("results", help="results table (CSV; JSON/JSONL/Parquet by suffix)")
        _add_table_options(sub)
        if method == "backtest":
            sub.add_argument("--method", choices=METHODS, nargs="+", default=["vpnls"],
                             help="law(s) to backtest (default vpnls)")
            group = sub.add_mutually_exclusive_group()
            group.add_argument("--holdout", type=positive_int, default=1, help="hold out the top K budgets (default 1)")
            group.add_argument("--cut", type=positive_float, help="train on budgets below this compute")
            group.add_argument("--all-holdouts", action="store_true",
                               help="every budget above the third held out in turn (train on all lower budgets), "
                                    "every method: mean |error| and 90%% coverage")
            group.add_argument("--probes", type=positive_int, metavar="P",
                               help="backtest the probe-trend correction: at every cut the next P budgets are probes and "
                                    "the law x (1 + its error trend at them) predicts the budgets beyond")
            sub.add_argument("--min-train-budgets", type=positive_int, default=3, metavar="K",
                             help="--all-holdouts, --probes: smallest number of training budgets (default 3)")
            sub.add_argument("--tolerance", type=positive_float, default=0.03,
                             help="--probes: a correction counts as tested when gate probes' test passes at this tolerance (default 0.03)")
            sub.add_argument("--probe-carry", choices=PROBE_CARRIES, default="linear",
                             help="--probes: carry the law's error at the probes by least squares linear in log C through "
                                  "all of them (default) or along the line through the two furthest")
        _add_method_options(sub, method)
        sub.add_argument("--bootstrap", type=nonnegative_int, default=0, metavar="N", help="bootstrap refits for intervals")
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument("--workers", type=positive_int, default=None, help="bootstrap processes (default: all cores)")
        sub.add_argument("--out", type=output_path, help="write the fit JSON here (atomically)")
        add_json_flag(sub)
        sub.set_defaults(func=run_fit if method != "backtest" else run_backtest, fit_method=method)

    pred = subparsers.add_parser("predict", help="predict loss / N* / D* from a fit JSON")
    pred.add_argument("fit", type=Path, help="FIT.json written by delphi fit")
    pred.add_argument("--compute", type=positive_float, nargs="+", help="compute budget(s) in FLOPs")
    pred.add_argument("--params", type=positive_float, help="N (with --tokens), for laws in N and D")
    pred.add_argument("--tokens", type=positive_float, help="D (with --params)")
    pred.add_argument("--config", type=Path, help="a train config (hero): predict at its N, D and FLOPs")
    pred.add_argument("--granularity", type=positive_float, help="MoE law: granularity d_ff/d_expert")
    pred.add_argument("--experts", type=positive_float, help="MoE law: routed expert count")
    add_json_flag(pred)
    pred.set_defaults(func=run_predict)


def _add_table_options(sub: argparse.ArgumentParser) -> None:
    for name in COLUMN_OPTIONS:
        flag = name.replace("_", "-")
        sub.add_argument(f"--{flag}-col", dest=f"{name}_col", metavar="COL", help=f"column holding {name}")
    sub.add_argument("--query", help="pandas query selecting rows, e.g. \"source == 'llama_3' and not outlier\"")
    sub.add_argument("--drop-invalid", action="store_true",
                     help="drop rows with a non-finite or non-positive value (named on stderr) instead of failing")
    sub.add_argument("--drop-duplicates", action="store_true",
                     help="drop rows that repeat an earlier row exactly (named on stderr) instead of failing; "
                          "a run_id on two different rows stays an error")
    sub.add_argument("--params-convention", choices=PARAM_CONVENTIONS, default="nonembedding",
                     help="how N is counted in a ladder table: active non-embedding (default), active incl. "
                          "embeddings, or flops_per_token/6 (external tables keep their params column)")
    sub.add_argument("--family", type=Path, metavar="FAMILY.json",
                     help="exact FLOPs per token of the model family (delphi ladder family); default "
                          "<results>.family.json if present, else a ladder table's own shapes, else 6ND")


def _add_method_options(sub: argparse.ArgumentParser, method: str) -> None:
    from delphi.cli import positive_float

    if method in ("isoflop", "backtest"):
        sub.add_argument("--robust", action="store_true", help="isoflop: Huber instead of least-squares parabolas")
    if method in ("parametric", "backtest"):
        sub.add_argument("--full-grid", action="store_true", help="parametric: L-BFGS-B from all 4500 grid starts (slow)")
    if method in ("frontier", "backtest"):
        sub.add_argument("--E", dest="e_mode", default="free", help="frontier asymptote: free, profile, or a number")
        sub.add_argument("--points", choices=("min", "vertex"), default="min", help="frontier: best observed loss or parabola vertex per budget")
        sub.add_argument("--target-compute", type=positive_float, nargs="+", help="frontier: compute(s) for the E-sensitivity table")
    if method in ("moe", "backtest"):
        sub.add_argument("--term", choices=("granularity", "experts"), default="granularity", help="moe: the expert term")


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


def _load(args: argparse.Namespace):
    from delphi.fits.data import load_results

    cols = {f"{name}_col": getattr(args, f"{name}_col") for name in COLUMN_OPTIONS}
    return load_results(
        args.results, query=args.query, drop_invalid=args.drop_invalid, drop_duplicates=args.drop_duplicates,
        params_convention=args.params_convention,
        family=args.family, warn=lambda line: print(line, file=sys.stderr), **cols,
    )


def _fit_function(args: argparse.Namespace, method: str):
    from delphi.fits import FITTERS

    options: dict[str, Any] = {"n_bootstrap": args.bootstrap, "seed": args.seed, "workers": args.workers}
    if args.bootstrap < 0:
        raise DelphiError(f"--bootstrap {args.bootstrap}: expected >= 0")
    if method == "isoflop":
        options["robust"] = args.robust
    elif method == "parametric":
        if args.full_grid:
            options["top_starts"] = None
    elif method == "frontier":
        options.update(E=args.e_mode, points=args.points, target_compute=args.target_compute)
    elif method == "moe":
        options["term"] = args.term
    return partial(FITTERS[method], **options)


def run_fit(args: argparse.Namespace) -> dict[str, Any]:
    from delphi.io import atomic_write_json, check_output_file

    if args.out is not None:  # before any work: a bad --out must not cost a bootstrap
        check_output_file(args.out, inputs=(args.results, getattr(args, "family", None)))
    table = _load(args)
    with _naming_table(table):
        fit = _fit_function(args, args.fit_method)(table)
    data = fit.to_json()
    print(fit.summary(), file=sys.stderr)
    if args.out:
        atomic_write_json(args.out, data)
        print(f"wrote {args.out}", file=sys.stderr)
    if data.get("bootstrap"):  # keep stdout small: the draws are in the file
        data = dict(data, bootstrap={"n": data["bootstrap"]["n"]})
    return data


def run_backtest(args: argparse.Namespace) -> dict[str, Any]:
    from delphi.io import check_output_file

    if args.out is not None:
        check_output_file(args.out, inputs=(args.results, getattr(args, "family", None)))
    table = _load(args)
    with _naming_table(table):
        return _backtest(args, table)


def _backtest(args: argparse.Namespace, table) -> dict[str, Any]:
    from delphi.fits.backtest import backtest
    from delphi.io import atomic_write_json

    if args.all_holdouts:
        return _all_holdouts(args, table)
    if args.probes:
        return _probe_holdouts(args, table)
    if len(args.method) > 1:
        raise DelphiError("backtest: several --method values need --all-holdouts (or run one method at a time)")
    result = backtest(table, _fit_function(args, args.method[0]), cut=args.cut, holdout=args.holdout)
    for b in result["budgets"]:
        ci = b["loss_interval_90"]
        ci_text = f"  90% [{ci[0]:.4f}, {ci[1]:.4f}] covered={b['covered_90']}" if ci else ""
        print(
            f"budget {b['budget']:.3g}: observed {b['observed_best_loss']:.4f}, predicted "
            f"{b['predicted_loss']:.4f} ({100 * b['rel_error']:+.2f}%){ci_text}",
            file=sys.stderr,
        )
    print(f"mean |relative error| {100 * result['mean_abs_rel_error']:.2f}% (allocation {result['allocation']})",
          file=sys.stderr)
    if args.out:
        atomic_write_json(args.out, result)
    return result


def _all_holdouts(args: argparse.Namespace, table) -> dict[str, Any]:
    from delphi.fits.backtest import all_holdouts
    from delphi.io import atomic_write_json

    fit_fns = {m: _fit_function(args, m) for m in args.method}
    result = all_holdouts(table, fit_fns, min_train_budgets=args.min_train_budgets)
    pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    for method, s in result["summary"].items():
        print(f"{method}: {s['n']} held-out points ({s['failed_fits']} failed fits): mean |error| "
              f"{pct(s['mean_abs_rel_error'])}, 90% coverage {pct(s['coverage_90'])}; one step ahead: "
              f"mean |error| {pct(s['one_step_mean_abs_rel_error'])}, coverage {pct(s['one_step_coverage_90'])}",
              file=sys.stderr)
    if args.out:
        atomic_write_json(args.out, result)
    return result


def _probe_holdouts(args: argparse.Namespace, table) -> dict[str, Any]:
    from delphi.fits.backtest import probe_holdouts
    from delphi.io import atomic_write_json

    if len(args.method) > 1:
        raise DelphiError("backtest --probes: one --method at a time")
    result = probe_holdouts(table, _fit_function(args, args.method[0]), probes=args.probes,
                            min_train_budgets=args.min_train_budgets, tolerance=args.tolerance, carry=args.probe_carry)
    pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    for label, s in result["summary"].items():
        print(f"{args.method[0]}, {label} ({s['n']} points beyond {args.probes} probes, {args.probe_carry}): mean |error| law "
              f"{pct(s['law_mean_abs_rel_error'])}, corrected {pct(s['corrected_mean_abs_rel_error'])}; 90% coverage "
              f"law {pct(s['law_coverage_90'])}, corrected {pct(s['corrected_coverage_90'])}", file=sys.stderr)
    if args.out:
        atomic_write_json(args.out, result)
    return result


def run_predict(args: argparse.Namespace) -> dict[str, Any]:
    from delphi.fits.results import load_fit, _plain

    fit = load_fit(args.fit)
    terms = {k: getattr(args, k) for k in ("granularity", "experts") if getattr(args, k) is not None}
    queries: list[dict[str, Any]] = []
    if args.config:
        convention = fit.family.convention if fit.family else fit.diagnostics.get("params_convention") or "nonembedding"
        queries.append(_config_query(args.config, fit.kind, convention))
        terms = {**queries[0].pop("terms"), **terms}
    if args.compute:
        queries += [{"compute": c} for c in args.compute]
    if args.params is not None or args.tokens is not None:
        if args.params is None or args.tokens is None:
            raise DelphiError("predict: --params and --tokens go together")
        queries.append({"params": args.params, "tokens": args.tokens})
    if not queries:
        raise DelphiError("predict: give --compute C, --params N --tokens D, or --config HERO.yaml")
    predictions = [_plain({**q, **fit.predict(**q, **terms)}) for q in queries]
    for p in predictions:
        shown = {k: v for k, v in p.items() if not isinstance(v, (list, dict))}
        print(", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()), file=sys.stderr)
    result = predictions[0] if len(predictions) == 1 else {"predictions": predictions}
    return {"fit": str(args.fit), "kind": fit.kind, "method": fit.method, **result}


def _config_query(path: Path, kind: str, convention: str = "nonembedding") -> dict[str, Any]:
    """A hero train config -> (N counted as the fit counts it, D, exact training FLOPs)."""
    from delphi.model.flops import count_params, flops_per_token
    from delphi.train.config import load_train_config

    cfg = load_train_config(path)
    counts = count_params(cfg.model)
    fpt = flops_per_token(cfg.model, cfg.data.seq_len)
    n = {"nonembedding": counts.nonembedding, "active": counts.active, "fpt6": fpt / 6.0}[convention]
    d = cfg.tokens
    terms = {}
    if cfg.model.moe is not None:
        terms = {"granularity": cfg.model.d_ff / cfg.model.moe.d_expert, "experts": cfg.model.moe.experts}
    from delphi.fits.laws import ND_KINDS

    if kind in ND_KINDS:
        return {"params": float(n), "tokens": float(d), "terms": terms}
    return {"compute": float(fpt * d), "terms": terms}
