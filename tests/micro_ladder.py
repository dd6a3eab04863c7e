"""A micro ladder for the executor tests: rungs of a few seconds of training each (plus compilation),
on a small private store, planned from studies/ladder_tiny.yaml."""

from __future__ import annotations

from pathlib import Path

import yaml

from delphi.data.store import prepare_store
from delphi.ladder.manifest import write_ladder
from delphi.ladder.plan import plan_ladder
from delphi.ladder.spec import ladder_spec_from_dict

TINY = Path(__file__).resolve().parents[1] / "studies" / "ladder_tiny.yaml"


def micro_spec(
    tmp_path: Path,
    budgets: list[float],
    seeds: tuple[int, ...] = (0,),
    *,
    name: str = "micro",
    tokens_per_param: float = 2.0,
    min_steps: int = 16,
    base_lr: float | None = None,
) -> dict:
    """The micro ladder's spec (a dict, as read from YAML), its store prepared in tmp_path/store."""
    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(40):
        (src / f"m{i:02d}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x + {j}\n" for j in range(300)))
    prepare_store(str(src), tmp_path / "store")
    raw = yaml.safe_load(TINY.read_text())
    raw.update(name=name, mode="tokens_per_param", budgets=budgets, seq_len=32)
    raw["tokens_per_param"] = {"ratio": tokens_per_param, "max_ratio_error": 0.9}
    raw["shape"]["widths"] = [8, 16]
    if base_lr is not None:
        raw["base"]["lr"] = base_lr
    raw["batch"].update(min_steps=min_steps, min_seqs=2, max_seqs=8)
    raw["run"].update(
        store=str(tmp_path / "store"),
        eval_tokens=512,
        evals_per_run=1,
        logs_per_run=2,
        checkpoints_per_run=2,
        seeds=list(seeds),
    )
    return raw


def micro_ladder(
    tmp_path: Path,
    budgets: list[float],
    seeds: tuple[int, ...] = (0,),
    *,
    name: str = "micro",
    tokens_per_param: float = 2.0,
    min_steps: int = 16,
    base_lr: float | None = None,
) -> Path:
    """Plan the micro ladder into tmp_path/ladder (its store in tmp_path/store) and return that path."""
    spec = ladder_spec_from_dict(
        micro_spec(
            tmp_path, budgets, seeds, name=name, tokens_per_param=tokens_per_param, min_steps=min_steps, base_lr=base_lr
        )
    )
    ladder = tmp_path / "ladder"
    write_ladder(spec, plan_ladder(spec), ladder)
    return ladder
