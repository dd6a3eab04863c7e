"""The trainer's memory estimate against XLA's memory analysis of the compiled train step
(delphi.train.memory), and the refusal of a run whose compiled step does not fit.

Every shape of the default and eighth-edition ladders (planned in memory, as `delphi ladder plan`
plans them), of the GPU check and of the first H200 run, in f32 and bf16: tests/data/compiled_memory.json
holds XLA:CPU's analysis of each one's train chunk, written by `python benchmarks/memory_estimate.py
--ladders h200 gpu default v8 --write tests/data/compiled_memory.json` (136 programs, 2-10 s of
compilation each on a quiet 2-core machine). The default run holds the estimate to each row and recompiles a
few rows to show the file still describes this JAX; `-m slow` recompiles them all.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import load_benchmark

from delphi.train.config import train_config_from_dict
from delphi.train.memory import ESTIMATE_TOLERANCE, CompiledMemory, estimate_train_memory

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "tests" / "data" / "compiled_memory.json"
# Recompiled in every run: the smallest shape, a large-batch one and the widest of the eighth edition,
# and a dropless MoE rung of the first H200 run (16,384 tokens a step: compiled, never allocated)
LIVE = [
    ("default", "d16_L3_H2_ff64_E8k2x16_b2x128", "bf16"),
    ("v8", "d24_L3_H2_ff96_E8k2x24_b64x128", "f32"),
    ("v8", "d160_L3_H2_ff640_E8k2x160_b2x128", "bf16"),
    ("h200", "ladder-d256", "bf16"),
]
LADDERS = ("default", "v8", "gpu", "h200")  # benchmarks/memory_estimate.py's names
# A cached row recompiled under the JAX that wrote it must agree this closely (the same program)
SAME_JAX_TOLERANCE = 0.02


@pytest.fixture(scope="module")
def cache() -> dict:
    return json.loads(CACHE.read_text())


def rows(cache: dict) -> dict[tuple[str, str, str], dict]:
    return {(r["ladder"], r["shape"], r["precision"]): r for r in cache["rows"]}


def planned_shapes(ladder: str) -> dict:
    """Shape label -> train config of `ladder` (benchmarks/memory_estimate.py's planning)."""
    loaded = load_benchmark("memory_estimate")
    try:
        return next(loaded).ladder_shapes(ladder)
    finally:
        next(loaded, None)  # unregisters the module


def estimate_ratio(row: dict, compiled_total: int) -> float:
    estimate = estimate_train_memory(train_config_from_dict(row["config"]))
    return (estimate.total - estimate.runtime) / compiled_total


def test_the_cache_covers_every_shape_of_both_ladders_in_both_precisions(cache) -> None:
    """The file describes the ladders as they are planned today (a changed spec must rewrite it)."""
    cached = rows(cache)
    for ladder in LADDERS:
        shapes = planned_shapes(ladder)
        assert len(shapes) >= {"default": 16, "v8": 41}.get(ladder, 5)
        for label, cfg in shapes.items():
            for precision in ("f32", "bf16"):
                row = cached.get((ladder, label, precision))
                assert row is not None, f"{ladder} {label} {precision}: not in {CACHE.name}; rewrite it"
                planned = dataclasses.replace(cfg, precision=precision)
                assert train_config_from_dict(row["config"]).model == planned.model
                assert (row["batch"], row["seq_len"]) == (planned.data.batch_size, planned.data.seq_len)


def test_the_estimate_is_within_25_percent_of_every_compiled_shape(cache) -> None:
    ratios = {key: estimate_ratio(row, row["compiled"]["total"]) for key, row in rows(cache).items()}
    outside = {key: round(r, 3) for key, r in ratios.items() if abs(r - 1) > ESTIMATE_TOLERANCE}
    assert not outside, f"estimate / compiled outside 1 +- {ESTIMATE_TOLERANCE}: {outside}"
    assert len(ratios) >= 2 * (16 + 41)


def compile_row(row: dict) -> CompiledMemory:
    import jax

    from delphi.train.config import MeshConfig
    from delphi.train.sharding import make_mesh
    from delphi.train.trainer import _COMPILED, compile_train_chunk

    cfg = train_config_from_dict(row["config"])
    program, _ = compile_train_chunk([cfg], make_mesh(MeshConfig(), jax.devices()[:1]))
    _COMPILED.clear()
    return CompiledMemory.of(program)


def check_live(cache: dict, key: tuple[str, str, str]) -> None:
    import jax

    row = rows(cache)[key]
    memory = compile_row(row)
    assert abs(estimate_ratio(row, memory.total) - 1) <= ESTIMATE_TOLERANCE, (key, memory)
    if cache["jax"] == jax.__version__ and cache["platform"] == jax.devices()[0].platform:
        assert memory.total == pytest.approx(row["compiled"]["total"], rel=SAME_JAX_TOLERANCE), (key, memory)


@pytest.mark.parametrize("key", LIVE, ids=["-".join(k) for k in LIVE])
def test_a_few_shapes_compiled_again_agree(cache, key) -> None:
    check_live(cache, key)


@pytest.mark.slow
def test_every_shape_compiled_again_agrees(cache) -> None:
    for key in rows(cache):
        check_live(cache, key)


def test_a_run_whose_compiled_step_does_not_fit_is_refused_before_anything_is_written(store, tmp_path, monkeypatch):
    """The memory free is set between the estimate's need and the compiled step's (a shape whose
    estimate is below XLA's number): the estimate lets it through, XLA's number refuses it."""
    import jax

    from delphi.errors import DelphiError
    from delphi.train import memory
    from delphi.train.config import MeshConfig
    from delphi.train.sharding import make_mesh
    from delphi.train.trainer import compile_train_chunk, train

    ladder_cfg = planned_shapes("default")["d16_L3_H2_ff64_E8k2x16_b2x128"]  # estimate ~0.91x XLA's in bf16
    cfg = dataclasses.replace(
        ladder_cfg,
        data=dataclasses.replace(ladder_cfg.data, store=str(store)),
        precision="bf16",
        steps=8,
        log_every=8,
        eval_every=8,
        checkpoint_every=8,
        eval_tokens=256,
    ).validate()
    estimate = memory.estimate_train_memory(cfg)
    compiled = CompiledMemory.of(compile_train_chunk([cfg], make_mesh(MeshConfig(), jax.devices()[:1]))[0])
    cpus = len(jax.devices())
    estimate_need = cpus * (estimate.total - estimate.runtime) + estimate.runtime
    compiled_need = cpus * compiled.total + memory.JAX_RUNTIME_BYTES
    assert estimate_need < compiled_need, "this shape's estimate must lie below XLA's number for the check to apply"
    monkeypatch.setattr(memory, "host_available_bytes", lambda: (estimate_need + compiled_need) // 2)
    with pytest.raises(
        DelphiError,
        match=r"compiled train step needs .* temporaries .* the trainer's estimate .* more than this machine's available",
    ):
        train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
