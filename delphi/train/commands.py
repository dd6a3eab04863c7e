"""`delphi train [CONFIG.yaml] --out RUN_DIR [--resume] [--prereg FILE] [--json]`."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from delphi.train.config import load_train_config

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
    sub.add_argument("--prereg", help="preregistration file: show the predicted loss beside the actual one")
    sub.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_json_flag(sub)
    sub.set_defaults(func=run_train)


def run_train(args: argparse.Namespace):
    from delphi.prereg.format import predicted_loss_curve
    from delphi.train.trainer import train

    from delphi.io import check_output_dir

    config_path = Path(args.config) if args.config else default_config_path()
    check_output_dir(args.out, inputs=(config_path, args.prereg))
    cfg = load_train_config(config_path)
    predicted_loss = predicted_loss_curve(Path(args.prereg)) if args.prereg else None
    summary = train(
        cfg, Path(args.out), resume=args.resume, predicted_loss=predicted_loss,
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    status = summary["status"]
    val = summary.get("val_loss")
    print(
        f"{status}: {summary['steps']} steps, {summary['tokens']:,} tokens, "
        f"val loss {val if val is None else f'{val:.4f}'} nats/token, "
        f"{summary.get('val_bpb') or float('nan'):.4f} bits/byte, {summary['wall_time_s']:.1f} s -> {args.out}",
        file=sys.stderr,
    )
    if status == "completed":
        return summary
    if status == "diverged":
        return summary, 1
    return summary, 130  # stopped by a signal: resumable
