"""CLI: `delphi flops CONFIG.yaml`, `delphi mup coord-check` and `delphi mup lr-sweep` (delphi.model.lrsweep)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    from delphi.cli import add_json_flag, positive_float, positive_int

    sub = subparsers.add_parser(
        "flops", help="parameter counts and training FLOPs per token of a model or train config"
    )
    sub.add_argument("config", type=Path, help="a train config (model: + data:) or a bare model config YAML")
    sub.add_argument("--seq-len", type=positive_int, default=None, help="sequence length (default: data.seq_len, else 128)")
    add_json_flag(sub)
    sub.set_defaults(func=cmd_flops)

    mup = subparsers.add_parser("mup", help="muP verification")
    mup_sub = mup.add_subparsers(dest="mup_command", metavar="MUP_COMMAND", parser_class=type(mup))
    cc = mup_sub.add_parser(
        "coord-check", help="activation magnitudes vs width over the first Adam steps (muP must pass, SP must fail)"
    )
    cc.add_argument("--out", type=Path, required=True, help="directory for coordcheck.json and coordcheck.png")
    cc.add_argument("--param", choices=("mup", "sp", "both"), default="both", help="parameterisation(s) to check")
    cc.add_argument("--ffn", choices=("dense", "moe", "both"), default="both")
    cc.add_argument("--widths", default="32,64,128,256,512", help="comma-separated d_model values; the first is the base")
    cc.add_argument("--seeds", type=positive_int, default=4)
    cc.add_argument("--steps", type=positive_int, default=10)
    cc.add_argument("--lr", type=positive_float, default=None, help="base Adam LR (default: the spec's)")
    cc.add_argument("--layers", type=positive_int, default=1)
    cc.add_argument("--seq-len", type=positive_int, default=16)
    cc.add_argument("--batch-size", type=positive_int, default=8)
    add_json_flag(cc)
    cc.set_defaults(func=cmd_coord_check)
    from delphi.model.lrsweep import add_command as add_lr_sweep

    add_lr_sweep(mup_sub)  # `delphi mup lr-sweep`
    # Other parts can register more `delphi mup` subcommands on `mup_sub` via MUP_SUBPARSERS.
    global MUP_SUBPARSERS
    MUP_SUBPARSERS = mup_sub


MUP_SUBPARSERS: Any = None


def load_model_config(path: Path, seq_len: int | None) -> tuple[Any, int, str]:
    """(ModelConfig, seq_len, kind) from a train config or a bare model config."""
    from delphi.config_schema import from_dict
    from delphi.io import read_yaml
    from delphi.model.config import ModelConfig
    from delphi.train.config import DataConfig, load_train_config

    if not path.is_file():
        raise DelphiError(f"{path}: no such config file")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise DelphiError(f"{path}: expected a mapping (a train config or a model config)")
    if seq_len is not None and seq_len <= 0:
        raise DelphiError(f"--seq-len: must be a positive integer, got {seq_len}")
    if "model" in data:
        cfg = load_train_config(path)
        return cfg.model, seq_len or cfg.data.seq_len, "train"
    try:
        model = from_dict(ModelConfig, data).validate("model")
    except DelphiError as e:
        raise DelphiError(f"{path}: {e}") from None
    return model, seq_len or DataConfig().seq_len, "model"


def cmd_flops(args: argparse.Namespace) -> dict[str, Any]:
    from delphi.model.flops import flops_summary

    cfg, seq_len, kind = load_model_config(args.config, args.seq_len)
    result = {"config": str(args.config), "kind": kind, **flops_summary(cfg, seq_len)}
    print(format_flops(result), file=sys.stderr)
    return result


def format_flops(r: dict[str, Any]) -> str:
    lines = [
        f"{r['config']} ({r['kind']} config), seq_len {r['seq_len']}",
        f"  params total        {r['params_total']:>16,}",
        f"  params active       {r['params_active']:>16,}",
        f"  params non-embed.   {r['params_nonembedding']:>16,}   (N, active)",
        f"  params embedding    {r['params_embedding']:>16,}",
        f"  FLOPs/token (train) {r['flops_per_token']:>16,.0f}   (3 x forward, Chinchilla App. F)",
        f"  6N                  {r['flops_per_token_6n']:>16,.0f}   (ratio {r['flops_per_token'] / max(r['flops_per_token_6n'], 1):.3f})",
        f"  PaLM (MFU)          {r['flops_per_token_palm']:>16,.0f}",
        "  forward FLOPs/token by term:",
    ]
    forward = r["forward_breakdown"]
    total = sum(v for k, v in forward.items() if k != "embeddings")
    for k, v in forward.items():
        note = "  (gather: not counted)" if k == "embeddings" else f"  {100 * v / total:5.1f}%"
        lines.append(f"    {k:<18}{v:>16,.0f}{note}")
    return "\n".join(lines)


def cmd_coord_check(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    from delphi.model.coordcheck import CoordCheckSpec, coord_check, expected_outcome, save_report

    try:
        widths = tuple(int(w) for w in args.widths.split(","))
    except ValueError:
        raise DelphiError(f"--widths: expected comma-separated integers, got {args.widths!r}") from None
    if len(widths) < 2 or any(w <= 0 for w in widths) or list(widths) != sorted(set(widths)):
        raise DelphiError(f"--widths: need at least two increasing positive widths, got {args.widths!r}")
    for name in ("seeds", "steps", "layers", "seq_len", "batch_size"):
        if getattr(args, name) <= 0:
            raise DelphiError(f"--{name.replace('_', '-')}: must be a positive integer, got {getattr(args, name)}")
    if args.lr is not None and args.lr <= 0:
        raise DelphiError(f"--lr: must be positive, got {args.lr}")
    if args.out.exists() and not args.out.is_dir():
        raise DelphiError(f"--out: {args.out} exists and is not a directory")

    params = {"mup": [True], "sp": [False], "both": [True, False]}[args.param]
    ffns = {"dense": [False], "moe": [True], "both": [False, True]}[args.ffn]
    extra = {"lr": args.lr} if args.lr is not None else {}
    specs = [
        CoordCheckSpec(
            widths=widths, mup=m, moe=moe, seeds=tuple(range(args.seeds)), steps=args.steps,
            n_layers=args.layers, seq_len=args.seq_len, batch_size=args.batch_size, **extra,
        )
        for moe in ffns
        for m in params
    ]
    for spec in specs:  # validates every shape (e.g. a width the head size does not divide) before running
        for w in widths:
            spec.model_config(w)

    results = []
    for spec in specs:
        result = coord_check(spec)
        print(result.summary(), file=sys.stderr)
        results.append(result)
    passed = all(expected_outcome(r) for r in results)
    report = save_report(results, args.out, passed=passed)
    verdict = "muP passes and SP fails as expected" if report["passed"] else "unexpected outcome (see above)"
    print(f"coord-check: {verdict}; wrote {report['json']} and {report['plot']}", file=sys.stderr)
    return report, 0 if report["passed"] else 1
