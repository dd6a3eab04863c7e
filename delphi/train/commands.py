"""`delphi train [CONFIG.yaml] --out RUN_DIR [--seeds 0,1,2] [--resume] [--prereg FILE] [--json]`."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from delphi.errors import DelphiError, quoted
from delphi.train.config import load_train_config, naming_config

DEFAULT_CONFIG = "tiny.yaml"  # package data: delphi/defaults/tiny.yaml


def default_config_path() -> Path:
    return Path(str(resources.files("delphi") / "defaults" / DEFAULT_CONFIG))


def add_commands(subparsers) -> None:
    from delphi.cli import add_json_flag

    sub = subparsers.add_parser(
        "train",
        help="train one config into a run directory",
        description="Train one config; without CONFIG, the built-in tiny MoE on the stdlib corpus.",
    )
    sub.add_argument("config", nargs="?", help=f"training config YAML (default: built-in {DEFAULT_CONFIG})")
    sub.add_argument("--out", required=True, help="run directory")
    sub.add_argument("--resume", action="store_true", help="continue from the last good checkpoint")
    sub.add_argument(
        "--seeds",
        help="comma-separated seeds trained together in one program (seed and data.seed set to each): "
        "RUN_DIR/seed<S> per seed",
    )
    sub.add_argument("--prereg", help="preregistration file: show the predicted loss beside the actual one")
    sub.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_json_flag(sub)
    sub.set_defaults(func=run_train)


def run_train(args: argparse.Namespace):
    from delphi.io import check_output_dir
    from delphi.train import supervise
    from delphi.train.interrupt import check, deferred_signals

    # From here on Ctrl-C only sets a flag, also while JAX is imported (delphi.train.interrupt).
    with deferred_signals():
        config_path = Path(args.config) if args.config else default_config_path()
        check_output_dir(args.out, inputs=(config_path, args.prereg))
        cfg = load_train_config(config_path)
        seeds = parse_seeds(args.seeds) if args.seeds is not None else None
        check("start-up (nothing was written)")
        if not supervise.can_supervise():
            return _train(args, cfg, config_path, seeds)
        run_dirs = [Path(args.out)] if seeds is None else [Path(args.out) / f"seed{s}" for s in seeds]

        def work() -> int:
            from delphi.cli import emit

            result, code = _train(args, cfg, config_path, seeds)
            if result is not None:
                emit(args, result)
            return code

        return None, supervise.supervised(work, run_dirs)


def _train(args: argparse.Namespace, cfg, config_path: Path, seeds: list[int] | None) -> tuple[dict, int]:
    from delphi.train.interrupt import check

    check("start-up (nothing was written)")
    from delphi.prereg.format import predicted_loss_curve
    from delphi.train.trainer import train  # imports JAX: seconds

    check("start-up (nothing was written)")
    predicted_loss = predicted_loss_curve(Path(args.prereg)) if args.prereg else None
    progress = not args.no_progress and sys.stderr.isatty()
    try:
        if seeds is not None:
            return _run_seed_group(args, cfg, seeds, predicted_loss, progress)
        summary = train(cfg, Path(args.out), resume=args.resume, predicted_loss=predicted_loss, progress=progress)
    except DelphiError as e:
        raise naming_config(e, config_path) from None
    _report(summary, args.out)
    return summary, _exit_code(summary)


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise DelphiError(f"--seeds: expected comma-separated integers like 0,1,2, got {quoted(text)}") from None
    if any(s < 0 for s in seeds):
        raise DelphiError(f"--seeds: seeds must be >= 0, got {quoted(text)}")
    if len(set(seeds)) != len(seeds):
        raise DelphiError(f"--seeds: seeds must be unique, got {quoted(text)}")
    return seeds


def _run_seed_group(args: argparse.Namespace, cfg, seeds: list[int], predicted_loss, progress: bool):
    import dataclasses

    from delphi.train.trainer import train_group

    cfgs = [
        dataclasses.replace(
            cfg, seed=s, data=dataclasses.replace(cfg.data, seed=s), name=f"{cfg.name}_seed{s}" if cfg.name else None
        )
        for s in seeds
    ]
    run_dirs = [Path(args.out) / f"seed{s}" for s in seeds]
    summaries = train_group(cfgs, run_dirs, resume=args.resume, predicted_loss=predicted_loss, progress=progress)
    for summary, run_dir in zip(summaries, run_dirs):
        _report(summary, run_dir)
    return {f"seed{s}": summary for s, summary in zip(seeds, summaries)}, max(_exit_code(x) for x in summaries)


def _exit_code(summary: dict) -> int:
    return {"completed": 0, "diverged": 1}.get(summary["status"], 130)  # else stopped by a signal: resumable


def _report(summary: dict, out) -> None:
    status = summary["status"]
    val = summary.get("val_loss")
    print(
        f"{status}: {summary['steps']} steps, {summary['tokens']:,} tokens, "
        f"val loss {val if val is None else f'{val:.4f}'} nats/token, "
        f"{summary.get('val_bpb') or float('nan'):.4f} bits/byte, {summary['wall_time_s']:.1f} s -> {out}",
        file=sys.stderr,
    )
