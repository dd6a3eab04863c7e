"""`delphi plot isoflop|allocation|frontier|prediction|residuals|coordcheck|lrsweep|curves ... --out OUT.png`.

Every figure is written as OUT.png and OUT.svg (delphi.plot.style).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from delphi.cli import add_json_flag, add_log_options, add_table_options, log_columns, table_load_kwargs
from delphi.errors import DelphiError, quoted
from delphi.io import read_json, read_text
from delphi.path_policy import check_output_file


def add_commands(subparsers) -> None:

    plot = subparsers.add_parser("plot", help="figures (PNG + SVG)")
    sub = plot.add_subparsers(dest="plot_command", metavar="FIGURE")

    def figure(
        name: str, help: str, handler, inputs: list[tuple[str, dict]], *, table: bool = False, log: str | None = None
    ):
        """`table`: the results table's flags (as `delphi fit`'s); `log`: the run log's column flags, with this prefix."""
        p = sub.add_parser(name, help=help)
        for flag, kw in inputs:
            p.add_argument(flag, **kw)
        if table:
            add_table_options(p)
        if log is not None:
            add_log_options(p, flag_prefix=log)
        p.add_argument("--out", required=True, help="OUT.png (an .svg is written beside it)")
        p.add_argument(
            "--force",
            action="store_true",
            help="replace OUT.png/.svg even if they are not figures this command wrote (never an input)",
        )
        add_json_flag(p)
        p.set_defaults(func=handler)

    run_help = "the hero's run: a Delphi run dir, another trainer's metrics log or a directory holding one"
    figure(
        "isoflop",
        "loss vs N per budget with parabolas and optima",
        _isoflop,
        [
            ("results", {"help": "results table (CSV, JSON, JSONL or Parquet; map columns as in `delphi fit`)"}),
            ("--fit", {"help": "isoflop FIT.json (its optima)"}),
        ],
        table=True,
    )
    figure(
        "allocation",
        "N*(C) and D*(C) with 90%% bands and the hero",
        _allocation,
        [
            ("fit", {"help": "isoflop or parametric FIT.json"}),
            ("--results", {"help": "results table (optima are computed if the fit has none)"}),
            ("--hero", {"help": "HERO.yaml"}),
        ],
        table=True,
    )
    figure(
        "frontier",
        "L*(C): runs, fitted frontier, hero interval and actual",
        _frontier,
        [
            ("results", {"help": "results table"}),
            ("--fit", {"help": "FIT.json that predicts loss from compute"}),
            ("--prereg", {"help": "preregistration (hero interval, and the tokens a log must reach)"}),
            ("--run", {"help": f"{run_help} (actual point: its final loss)"}),
        ],
        table=True,
        log="log-",
    )
    figure(
        "prediction",
        "preregistered trajectory with bands vs the hero's eval points",
        _prediction,
        [("prereg", {"help": "preregistration file"}), ("--run", {"help": run_help})],
        log="",
    )
    figure(
        "residuals",
        "relative residuals of a fit against N and C",
        _residuals,
        [("results", {"help": "results table"}), ("--fit", {"required": True, "help": "FIT.json"})],
        table=True,
    )
    figure(
        "coordcheck",
        "muP coordinate check (the model part's own plot)",
        _coordcheck,
        [("report", {"help": "coordcheck.json from `delphi mup coord-check`"})],
    )
    figure(
        "lrsweep",
        "final loss vs base LR per width",
        _lrsweep,
        [
            ("sweep", {"help": "CSV, JSON or JSONL records with width, lr, loss"}),
            ("--width-col", {"metavar": "COL", "default": "width", "help": "column holding the width (default width)"}),
            ("--lr-col", {"metavar": "COL", "default": "lr", "help": "column holding the base LR (default lr)"}),
            (
                "--loss-col",
                {"metavar": "COL", "default": "loss", "help": "column holding the final loss (default loss)"},
            ),
            ("--query", {"metavar": "EXPR", "help": "select rows (the language of `delphi fit --query`)"}),
        ],
    )
    figure(
        "curves",
        "ladder eval curves with the LR-annealing curve law",
        _curves,
        [("ladder", {"help": "ladder dir"}), ("--no-backtest", {"action": "store_true"})],
    )
    plot.set_defaults(func=lambda args: (plot.print_help(sys.stderr), ({"error": "give a figure"}, 2))[1])


def _done(fig, args) -> dict:
    from delphi.plot.style import save_figure  # lazy: matplotlib

    files = save_figure(fig, args.out, written_by=_command(args))
    print(f"wrote {', '.join(files)}", file=sys.stderr)
    return {"files": files}


# Arguments of `delphi plot` commands that name input files or directories.
INPUT_ARGS = ("results", "fit", "hero", "prereg", "run", "report", "sweep", "ladder")


def _command(args) -> str:
    """The command that writes the figure, as its files say (delphi.path_policy)."""
    return f"plot {args.plot_command}"


def _check_out(args) -> None:
    """Refuse (exit 2, before any work) an --out whose .png/.svg cannot be written or is an input."""

    inputs = tuple(getattr(args, name) for name in INPUT_ARGS if getattr(args, name, None))
    check_output_file(args.out, inputs=inputs, command=_command(args), force=args.force)
    if not Path(args.out).resolve().parent.is_dir():  # a figure goes beside existing files, never in a new tree
        raise DelphiError(f"--out {args.out}: directory does not exist")
    stem = Path(args.out).with_suffix("") if Path(args.out).suffix.lower() in (".png", ".svg") else Path(args.out)
    for ext in (".png", ".svg"):
        check_output_file(stem.with_suffix(ext), inputs=inputs, flag="--out", command=_command(args), force=args.force)


def _table(path: str, args):
    """The results table through `delphi fit`'s loader, with the command's mapping, query and drop flags."""
    from delphi.fits.data import load_results  # lazy: pandas

    return load_results(path, **table_load_kwargs(args))


def _fit(path: str):
    from delphi.fits.results import load_fit  # lazy: numpy and the fits

    return load_fit(path)


def _hero(path: str | None):
    if not path:
        return None
    from delphi.model.flops import count_params  # lazy: the model configs
    from delphi.train.config import load_train_config  # lazy: the trainer config

    cfg = load_train_config(path)
    return {"compute": cfg.flops, "params": count_params(cfg.model).nonembedding, "tokens": cfg.tokens}


def _isoflop(args):
    from delphi.plot.figures import isoflop_figure  # lazy: matplotlib

    _check_out(args)
    table = _table(args.results, args)
    if "budget" not in table:
        raise DelphiError(f"{args.results}: no budget column; isoFLOP curves need one budget per run")
    optima = _fit(args.fit).extra.optima if args.fit else None
    return _done(isoflop_figure(table, optima), args)


def _allocation(args):
    import pandas as pd

    from delphi.plot.figures import allocation_figure  # lazy: matplotlib

    _check_out(args)
    fit = _fit(args.fit)
    optima = fit.extra.optima
    if optima:
        frame = pd.DataFrame(
            {
                "budget": [o["flops"] for o in optima],
                "params": [o["params_opt"] for o in optima],
                "tokens": [o["tokens_opt"] for o in optima],
            }
        )
    elif args.results:
        from delphi.fits.isoflop import per_budget_optima  # lazy: pandas and scipy

        opt, _ = per_budget_optima(_table(args.results, args))
        frame = pd.DataFrame(
            {
                "budget": [o["flops"] for o in opt],
                "params": [o["params_opt"] for o in opt],
                "tokens": [o["tokens_opt"] for o in opt],
            }
        )
    else:
        raise DelphiError(f"{args.fit}: has no per-budget optima; give --results to compute them")
    hero = _hero(args.hero) or {}
    return _done(allocation_figure(frame, fit, hero.get("compute"), hero.get("params"), hero.get("tokens")), args)


def _frontier(args):
    from delphi.plot.figures import frontier_figure  # lazy: matplotlib
    from delphi.train.runlog import LogOptions, RunEnd, is_delphi_run_dir, read_to_end  # lazy: the run reader and YAML

    _check_out(args)
    table = _table(args.results, args)
    fit = _fit(args.fit) if args.fit else None
    hero_c = interval = actual = None
    end = RunEnd(None)
    if args.prereg:
        from delphi.prereg_format import load_prereg  # lazy: YAML

        doc = load_prereg(args.prereg).doc
        final = doc["prediction"]["final"]
        hero_c = doc["hero"]["flops"]
        end = RunEnd.of_hero(doc["hero"])
        lo, hi = final.get("loss_90") or (final["loss"], final["loss"])
        interval = (final["loss"], lo, hi)
    note = None
    if args.run:
        if Path(args.run).exists() and not is_delphi_run_dir(Path(args.run)) and not args.prereg:
            raise DelphiError(
                f"--run {args.run}: another trainer's log; give --prereg, whose hero says the tokens the log "
                "must reach and the compute to draw its final loss at"
            )
        run = read_to_end(args.run, end, LogOptions(log_columns(args)))
        actual = run.final_loss  # a log's once an eval reached the hero's end; a Delphi run's summary's
        if hero_c is None:
            from delphi.train.rundir import read_summary  # lazy: the run reader

            hero_c = read_summary(Path(args.run)).get("flops")
        if actual is None or hero_c is None:
            last = (
                f"its last eval at {run.evals[-1].tokens:.4g} tokens"
                if run.evals and run.evals[-1].tokens
                else "no eval yet"
            )
            why = (
                "its compute is unknown (no summary.json with flops): give --prereg"
                if actual is not None
                else f"the run has no final loss yet (status {run.status})"
                if run.kind != "log"
                else f"the log has not reached {end.describe()} ({last})"
            )
            note = f"--run {args.run}: no actual point drawn: {why}"
            print(note, file=sys.stderr)
    result = _done(frontier_figure(table, fit, hero_c, interval, actual), args)
    return result | {"actual": actual if note is None else None, **({"note": note} if note else {})}


def _prediction(args):
    from delphi.plot.figures import prediction_figure  # lazy: matplotlib
    from delphi.prereg_format import load_prereg  # lazy: YAML
    from delphi.train.runlog import LogOptions, RunEnd, read_to_end  # lazy: the run reader and YAML
    from delphi.train.verdict import compare  # lazy: YAML and the run reader, kept out of `delphi --help`

    _check_out(args)
    prereg = load_prereg(args.prereg)
    state = verdict = None
    if args.run:
        state = read_to_end(args.run, RunEnd.of_hero(prereg.doc["hero"]), LogOptions(log_columns(args)))
        verdict = compare(prereg, state)["verdict"]
    return _done(prediction_figure(prereg.doc, state, verdict), args)


def _residuals(args):
    import numpy as np

    from delphi.plot.figures import residuals_figure  # lazy: matplotlib

    _check_out(args)
    table = _table(args.results, args)
    fit = _fit(args.fit)
    terms = {t: table[t].to_numpy(float) for t in fit.law_terms if t in table}
    pred = fit.predict_run(
        params=table["params"].to_numpy(float),
        tokens=table["tokens"].to_numpy(float),
        flops=table["flops"].to_numpy(float),
        **terms,
    )["loss"]
    return _done(
        residuals_figure(table, np.asarray(pred, float), title=f"{fit.kind} fit ({fit.method}) residuals"), args
    )


def _coordcheck(args):
    from delphi.plot.figures import coordcheck_figure  # lazy: matplotlib

    _check_out(args)

    report = read_json(args.report, what="coord-check JSON")
    results = report.get("results") if isinstance(report, dict) else None
    if not results:
        raise DelphiError(f"{args.report}: no 'results'; expected coordcheck.json from `delphi mup coord-check`")
    return _done(coordcheck_figure(results), args)


def _lrsweep(args):
    import pandas as pd

    from delphi.plot.figures import lrsweep_figure  # lazy: matplotlib

    _check_out(args)
    path = Path(args.sweep)
    if not path.is_file():
        raise DelphiError(f"{path}: file not found")

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
    return _done(lrsweep_figure(_sweep_table(records, path, args)), args)


def _sweep_table(records, path: Path, args):
    """width, lr and loss of an LR sweep's records, after --query, each a finite positive number:
    a header-only table, a missing column or a value that is not one is a DelphiError naming it."""
    import numpy as np
    import pandas as pd

    from delphi.query import select_rows  # lazy: pandas

    if args.query:
        try:
            records = select_rows(records, args.query)
        except DelphiError as e:
            raise DelphiError(f"{path}: {e}") from None
    columns = {"width": args.width_col, "lr": args.lr_col, "loss": args.loss_col}
    for name, column in columns.items():
        if column not in records:
            raise DelphiError(
                f"{path}: no column {quoted(column)} for {name} (map it with --{name}-col); "
                f"columns are {list(records.columns)}"
            )
    if records.empty:
        raise DelphiError(
            f"{path}: no rows"
            + (f" after --query {quoted(args.query)}" if args.query else " (a header only)")
            + "; expected one row per (width, lr) run"
        )
    table = pd.DataFrame({name: pd.to_numeric(records[column], errors="coerce") for name, column in columns.items()})
    for name, column in columns.items():
        bad = ~(np.isfinite(table[name].to_numpy(float)) & (table[name].to_numpy(float) > 0))
        if bad.any():
            row = records.index[int(np.flatnonzero(bad)[0])]
            value = records[column].loc[row]
            value = value.item() if hasattr(value, "item") else value  # numpy scalars quoted as the numbers they are
            raise DelphiError(
                f"{path}: row {row}: {column} = {quoted(value, 60)}, expected a finite "
                f"number > 0 ({int(bad.sum())} such rows)"
            )
    return table


def _curves(args):
    from delphi.fits import curves as cv  # lazy: pandas and scipy
    from delphi.plot.figures import curves_figure  # lazy: matplotlib

    _check_out(args)
    curves = cv.load_ladder_curves(args.ladder)
    fit = cv.fit_curve_law(curves, bootstrap=0)
    backtest = (
        None if args.no_backtest or len({c.params for c in curves}) < 3 else cv.backtest_curve_law(curves, bootstrap=0)
    )
    return _done(curves_figure(curves, fit, backtest), args)
