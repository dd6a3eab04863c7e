"""CLI: `delphi flops CONFIG.yaml` (the muP experiments' `delphi mup ...` live in delphi.experiments.commands)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    from delphi.cli import add_json_flag, positive_int

    sub = subparsers.add_parser(
        "flops", help="parameter counts and training FLOPs per token of a model or train config"
    )
    sub.add_argument("config", type=Path, help="a train config (model: + data:) or a bare model config YAML")
    sub.add_argument("--seq-len", type=positive_int, default=None, help="sequence length (default: data.seq_len, else 128)")
    add_json_flag(sub)
    sub.set_defaults(func=cmd_flops)


def load_model_config(path: Path, seq_len: int | None) -> tuple[Any, int, str]:
    """(ModelConfig, seq_len, kind) from a train config or a bare model config."""
    from delphi.config_schema import from_dict
    from delphi.io import read_yaml
    from delphi.model.config import ModelConfig
    from delphi.train.config import DataConfig, load_train_config

    if not path.exists():
        raise DelphiError(f"{path}: no such config file")
    data = read_yaml(path)  # a directory, binary or broken YAML: one line naming the file
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
