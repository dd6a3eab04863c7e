"""`delphi train [CONFIG.yaml] --out RUN_DIR [--seeds 0,1,2] [--resume] [--prereg FILE] [--json]`, and
`delphi flops CONFIG.yaml` (it reads a train config or a bare model config: moved here from
delphi/model/commands.py, which sits below the train config in the layer order)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from delphi.cli import add_device_flag, add_json_flag, emit, positive_int
from delphi.config_schema import from_dict
from delphi.errors import DelphiError, quoted
from delphi.io import read_yaml
from delphi.model.config import ModelConfig
from delphi.model.flops import flops_summary
from delphi.path_policy import check_input_file, check_not_an_input, check_output_dir
from delphi.prereg_format import predicted_loss_curve
from delphi.signals import PARENT_PID_ENV, die_with_parent
from delphi.train import supervise
from delphi.train.config import SEED_LIMIT, DataConfig, load_train_config, naming_config
from delphi.train.environment import check_training_environment
from delphi.train.interrupt import check, deferred_signals
from delphi.train.rundir import CONFIG_FILE, METRICS_FILE, STATUS_FILE, SUMMARY_FILE

DEFAULT_CONFIG = "tiny.yaml"  # package data: delphi/defaults/tiny.yaml


def default_config_path() -> Path:
    return Path(str(resources.files("delphi") / "defaults" / DEFAULT_CONFIG))


def add_commands(subparsers) -> None:
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
    add_device_flag(sub)
    sub.add_argument(
        "--force",
        action="store_true",
        help="train into a non-empty --out that is not a run dir (its config.yaml etc. are replaced)",
    )
    add_json_flag(sub)
    sub.set_defaults(func=run_train)
    add_flops_command(subparsers)


def run_train(args: argparse.Namespace):
    # From here on Ctrl-C only sets a flag, also while JAX is imported (delphi.train.interrupt).
    with deferred_signals():
        _stop_with_parent()
        config_path = Path(args.config) if args.config else default_config_path()
        check_output_dir(args.out, inputs=(config_path, args.prereg))
        _check_run_dir(Path(args.out), (config_path, args.prereg), args.seeds, args.force)
        cfg = load_train_config(config_path)
        seeds = parse_seeds(args.seeds) if args.seeds is not None else None

        check_training_environment([cfg.wandb.mode])  # DELPHI_*, WANDB_MODE: one line naming a bad one, nothing written
        check("start-up (nothing was written)")
        if not supervise.can_supervise():
            return _train(args, cfg, config_path, seeds)
        run_dirs = [Path(args.out)] if seeds is None else [Path(args.out) / f"seed{s}" for s in seeds]

        def work() -> int:
            result, code = _train(args, cfg, config_path, seeds)
            if result is not None:
                emit(args, result)
            return code

        return None, supervise.supervised(work, run_dirs)


def _stop_with_parent() -> None:
    """A trainer started by a study for one of its seeds (PARENT_PID_ENV set to the study's pid) stops
    at a checkpoint, as on SIGTERM, when the study dies, however it dies (kill -9 included)."""
    text = os.environ.get(PARENT_PID_ENV)
    if not text:
        return
    if not text.isdigit():
        raise DelphiError(f"{PARENT_PID_ENV}={quoted(text)}: expected the pid of the process this trainer stops with")
    if not die_with_parent(int(text)):
        os.kill(os.getpid(), signal.SIGTERM)  # the study is gone already: stop as it would have asked


def _train(args: argparse.Namespace, cfg, config_path: Path, seeds: list[int] | None) -> tuple[dict, int]:
    check("start-up (nothing was written)")
    from delphi.train.trainer import train  # lazy: imports JAX (seconds), after the Ctrl-C check above

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


def _check_run_dir(out: Path, inputs: tuple, seeds: str | None, force: bool) -> None:
    """The files a run writes (config.yaml, status.json, metrics.jsonl, summary.json) are never an
    input, and replace only a run dir's own (one with status.json), unless --force."""
    run_dirs = [out / f"seed{s}" for s in parse_seeds(seeds)] if seeds is not None else [out]
    names = (CONFIG_FILE, STATUS_FILE, METRICS_FILE, SUMMARY_FILE)
    for run_dir in run_dirs:
        check_not_an_input([run_dir / name for name in names], inputs)
        if force or (run_dir / STATUS_FILE).is_file():
            continue
        theirs = [run_dir / name for name in names if (run_dir / name).exists()]
        if theirs:
            raise DelphiError(
                f"--out {out}: {theirs[0]} exists but {run_dir} is not a run dir (no {STATUS_FILE}); "
                "training would replace it: choose another directory, or pass --force"
            )


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise DelphiError(f"--seeds: expected comma-separated integers like 0,1,2, got {quoted(text)}") from None
    if any(not 0 <= s < SEED_LIMIT for s in seeds):
        raise DelphiError(f"--seeds: seeds must be integers in [0, 2**63) (a JAX key's range), got {quoted(text)}")
    if len(set(seeds)) != len(seeds):
        raise DelphiError(f"--seeds: seeds must be unique, got {quoted(text)}")
    return seeds


def _run_seed_group(args: argparse.Namespace, cfg, seeds: list[int], predicted_loss, progress: bool):
    from delphi.train.trainer import train_group  # lazy: imports JAX (seconds)

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


# --------------------------------------------------------------------------- delphi flops


def add_flops_command(subparsers: argparse._SubParsersAction) -> None:
    sub = subparsers.add_parser(
        "flops", help="parameter counts and training FLOPs per token of a model or train config"
    )
    sub.add_argument("config", type=Path, help="a train config (model: + data:) or a bare model config YAML")
    sub.add_argument(
        "--seq-len", type=positive_int, default=None, help="sequence length (default: data.seq_len, else 128)"
    )
    add_json_flag(sub)
    sub.set_defaults(func=cmd_flops)


def load_model_config(path: Path, seq_len: int | None) -> tuple[Any, int, str]:
    """(ModelConfig, seq_len, kind) from a train config or a bare model config."""
    check_input_file(path, "config file (YAML)", not_found="no such config file")  # `-`, /dev/null, a FIFO: named
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
