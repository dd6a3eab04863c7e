"""`delphi plot isoflop|allocation|frontier|prediction|residuals|coordcheck|lrsweep|curves ... --out OUT.png`.

Every figure is written as OUT.png and OUT.svg (delphi.plot.style).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from delphi.errors import DelphiError, quoted


def add_commands(subparsers) -> None:
    from delphi.cli import add_json_flag

    plot = subparsers.add_parser("plot", help="figures (PNG + SVG)")
    sub = plot.add_subparsers(dest="plot_command", metavar="FIGURE")

    def figure(name: str, help: str, handler, inputs: list[tuple[str, dict]]):
        p = sub.add_parser(name, help=help)
        for flag, kw in inputs:
            p.add_argument(flag, **kw)
        p.add_argument("--out", required=True, help="OUT.png (an .svg is written beside it)")
        p.add_argument("--force", action="store_true",
                       help="replace OUT.png/.svg even if they are not figures this command wrote (never an input)")
        add_json_flag(p)
        p.set_defaults(func=handler)

    figure("isoflop", "loss vs N per budget with parabolas and optima", _isoflop,
           [("results", {"help": "results table (canonical columns)"}), ("--fit", {"help": "isoflop FIT.json (its optima)"})])
    figure("allocation", "N*(C) and D*(C) with 90%% bands and the hero", _allocation,
           [("fit", {"help": "isoflop or parametric FIT.json"}), ("--results", {"help": "results table (optima are computed if the fit has none)"}),
            ("--hero", {"help": "HERO.yaml"})])
    figure("frontier", "L*(C): runs, fitted frontier, hero interval and actual", _frontier,
           [("results", {"help": "results table"}), ("--fit", {"help": "FIT.json that predicts loss from compute"}),
            ("--prereg", {"help": "preregistration (hero interval)"}), ("--run", {"help": "hero run dir (actual point)"})])
    figure("prediction", "preregistered trajectory with bands vs the hero's eval points", _prediction,
           [("prereg", {"help": "preregistration file"}), ("--run", {"help": "hero run dir"})])
    figure("residuals", "relative residuals of a fit against N and C", _residuals,
           [("results", {"help": "results table"}), ("--fit", {"required": True, "help": "FIT.json"})])
    figure("coordcheck", "muP coordinate check (the model part's own plot)", _coordcheck,
           [("report", {"help": "coordcheck.json from `delphi mup coord-check`"})])
    figure("lrsweep", "final loss vs base LR per width", _lrsweep,
           [("sweep", {"help": "CSV or JSON records with width, lr, loss"})])
    figure("curves", "ladder eval curves with the LR-annealing curve law", _curves,
           [("ladder", {"help": "ladder dir"}), ("--no-backtest", {"action": "store_true"})])
    plot.set_defaults(func=lambda args: (plot.print_help(sys.stderr), ({"error": "give a figure"}, 2))[1])


def _done(fig, args) -> dict:
    from delphi.plot.style import save_figure

    files = save_figure(fig, args.out, written_by=_command(args))
    print(f"wrote {', '.join(files)}", file=sys.stderr)
    return {"files": files}


# Arguments of `delphi plot` commands that name input files or directories.
INPUT_ARGS = ("results", "fit", "hero", "prereg", "run", "report", "sweep", "ladder")


def _command(args) -> str:
    """The command that writes the figure, as its files say (delphi.io's output policy)."""
    return f"plot {args.plot_command}"


def _check_out(args) -> None:
    """Refuse (exit 2, before any work) an --out whose .png/.svg cannot be written or is an input."""
    from delphi.io import check_output_file

    inputs = tuple(getattr(args, name) for name in INPUT_ARGS if getattr(args, name, None))
    check_output_file(args.out, inputs=inputs, command=_command(args), force=args.force)
    if not Path(args.out).resolve().parent.is_dir():  # a figure goes beside existing files, never in a new tree
        raise DelphiError(f"--out {args.out}: directory does not exist")
    stem = Path(args.out).with_suffix("") if Path(args.out).suffix.lower() in (".png", ".svg") else Path(args.out)
    for ext in (".png", ".svg"):
        check_output_file(stem.with_suffix(ext), inputs=inputs, flag="--out", command=_command(args), force=args.force)


def _table(path: str):
    from delphi.fits.data import load_results

    return load_results(path)


def _fit(path: str):
    from delphi.fits.results import load_fit

    return load_fit(path)


def _hero(path: str | None):
    if not path:
        return None
    from delphi.model.flops import count_params
    from delphi.train.config import load_train_config

    cfg = load_train_config(path)
    return {"compute": cfg.flops,
            "params": count_params(cfg.model).nonembedding, "tokens": cfg.tokens}


def _isoflop(args):
    from delphi.plot.figures import isoflop_figure

    _check_out(args)
    table = _table(args.results)
    if "budget" not in table:
        raise DelphiError(f"{args.results}: no budget column; isoFLOP curves need one budget per run")
    optima = _fit(args.fit).extra.get("optima") if args.fit else None
    return _done(isoflop_figure(table, optima), args)


def _allocation(args):
    import pandas as pd

    from delphi.plot.figures import allocation_figure

    _check_out(args)
    fit = _fit(args.fit)
    optima = fit.extra.get("optima")
    if optima:
        frame = pd.DataFrame({"budget": [o["flops"] for o in optima], "params": [o["params_opt"] for o in optima],
                              "tokens": [o["tokens_opt"] for o in optima]})
    elif args.results:
        from delphi.fits.isoflop import per_budget_optima

        opt, _ = per_budget_optima(_table(args.results))
        frame = pd.DataFrame({"budget": [o["flops"] for o in opt], "params": [o["params_opt"] for o in opt],
                              "tokens": [o["tokens_opt"] for o in opt]})
    else:
        raise DelphiError(f"{args.fit}: has no per-budget optima; give --results to compute them")
    hero = _hero(args.hero) or {}
    return _done(allocation_figure(frame, fit, hero.get("compute"), hero.get("params"), hero.get("tokens")), args)


def _frontier(args):
    from delphi.plot.figures import frontier_figure

    _check_out(args)
    table = _table(args.results)
    fit = _fit(args.fit) if args.fit else None
    hero_c = interval = actual = None
    if args.prereg:
        from delphi.prereg_format import load_prereg

        doc = load_prereg(args.prereg).doc
        final = doc["prediction"]["final"]
        hero_c = doc["hero"]["flops"]
        lo, hi = final.get("loss_90") or (final["loss"], final["loss"])
        interval = (final["loss"], lo, hi)
    if args.run:
        from delphi.prereg.check import read_run_dir

        state = read_run_dir(args.run)
        actual = state.final_loss
        if hero_c is None:
            from delphi.train.rundir import read_summary

            summary = read_summary(Path(args.run))
            hero_c = summary.get("flops")
    return _done(frontier_figure(table, fit, hero_c, interval, actual), args)


def _prediction(args):
    from delphi.plot.figures import prediction_figure
    from delphi.prereg_format import load_prereg

    _check_out(args)
    prereg = load_prereg(args.prereg)
    state = verdict = None
    if args.run:
        from delphi.prereg.check import compare, read_run_dir

        state = read_run_dir(args.run)
        verdict = compare(prereg, state)["verdict"]
    return _done(prediction_figure(prereg.doc, state, verdict), args)


def _residuals(args):
    import numpy as np

    from delphi.plot.figures import residuals_figure

    _check_out(args)
    table = _table(args.results)
    fit = _fit(args.fit)
    terms = {t: table[t].to_numpy(float) for t in fit.law_terms if t in table}
    pred = fit.predict_run(params=table["params"].to_numpy(float), tokens=table["tokens"].to_numpy(float),
                           flops=table["flops"].to_numpy(float), **terms)["loss"]
    return _done(residuals_figure(table, np.asarray(pred, float), title=f"{fit.kind} fit ({fit.method}) residuals"), args)


def _coordcheck(args):
    from delphi.plot.figures import coordcheck_figure

    _check_out(args)
    from delphi.io import read_json

    report = read_json(args.report, what="coord-check JSON")
    results = report.get("results") if isinstance(report, dict) else None
    if not results:
        raise DelphiError(f"{args.report}: no 'results'; expected coordcheck.json from `delphi mup coord-check`")
    return _done(coordcheck_figure(results), args)


def _lrsweep(args):
    import pandas as pd

    from delphi.plot.figures import lrsweep_figure

    _check_out(args)
    path = Path(args.sweep)
    if not path.is_file():
        raise DelphiError(f"{path}: file not found")
    from delphi.io import read_json, read_text

    if path.suffix == ".json":
        data = read_json(path)
        try:
            records = pd.DataFrame(data.get("runs", data.get("results", data)) if isinstance(data, dict) else data)
        except (ValueError, TypeError) as e:
            raise DelphiError(f"{path}: expected records with width, lr, loss ({e})") from None
    else:
        try:
            records = pd.read_csv(io.StringIO(read_text(path, what="CSV file")))
        except (ValueError, pd.errors.ParserError) as e:  # EmptyDataError is a ValueError
            raise DelphiError(f"{path}: not a CSV table ({' '.join(str(e).split())})") from None
    missing = [c for c in ("width", "lr", "loss") if c not in records]
    if missing:
        raise DelphiError(f"{path}: missing column {quoted(missing[0])} (expected width, lr, loss)")
    return _done(lrsweep_figure(records), args)


def _curves(args):
    from delphi.fits import curves as cv
    from delphi.plot.figures import curves_figure

    _check_out(args)
    curves = cv.load_ladder_curves(args.ladder)
    fit = cv.fit_curve_law(curves, bootstrap=0)
    backtest = None if args.no_backtest or len({c.params for c in curves}) < 3 else cv.backtest_curve_law(curves, bootstrap=0)
    return _done(curves_figure(curves, fit, backtest), args)
