"""A planner for any scale and any trainer: `ladder plan` with no token store, defaults that hold at
1e17-1e21 FLOPs, refused absurd plans, printed caps, expert sweeps, and `ladder export`."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path

import pytest
import yaml

from delphi.cli import main as cli_main
from delphi.ladder.export import CONVENTIONS, export_ladder
from delphi.ladder.manifest import read_manifest
from delphi.ladder.plan import plan_ladder
from delphi.ladder.spec import (
    LARGE_SCALE_DEFAULTS,
    LARGE_SCALE_MAX_TOKENS_PER_PARAM,
    LARGE_SCALE_MIN_TOKENS_PER_PARAM,
    ladder_spec_from_dict,
    large_scale_fills,
    load_ladder_spec,
)
from delphi.train.config import load_train_config

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "delphi" / "defaults" / "ladder_default.yaml"
SHIPPED = [DEFAULT, *sorted((ROOT / "studies").glob("ladder_*.yaml"))]

# The GPU-scale MoE ladder, as a lab would write it by hand from docs/spec-reference.md.
GPU_MOE = {
    "name": "gpu_moe",
    "budgets": [1.0e17, 1.0e18, 1.0e19],
    "seq_len": 2048,
    "vocab_size": 50304,
    "shape": {"moe": {"experts": [8, 16, 32, 64], "top_k": 4}},
}


def _write(tmp_path: Path, data: dict, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _plan(
    tmp_path: Path, data: dict, capsys, name: str = "spec.yaml", out: str = "ladder"
) -> tuple[int, dict | None, str]:
    code = cli_main(["ladder", "plan", str(_write(tmp_path, data, name)), "--out", str(tmp_path / out), "--json"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


@pytest.fixture
def no_store(tmp_path, monkeypatch) -> Path:
    """DELPHI_CACHE pointing at an empty directory: no token store anywhere."""
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    monkeypatch.setenv("DELPHI_CACHE", str(cache))
    return cache


def test_a_gpu_scale_moe_ladder_with_an_expert_sweep_plans_and_exports_with_no_store(tmp_path, no_store, capsys):
    code, out, err = _plan(tmp_path, GPU_MOE, capsys)
    assert code == 0, err
    assert list(no_store.iterdir()) == []  # no store was read, prepared or cached
    ladder = tmp_path / "ladder"
    rows = read_manifest(ladder)
    # Each budget planned for each expert count, ids unique, each rung recording its own experts.
    assert {(float(r["budget"]), int(r["experts"])) for r in rows} == {
        (b, e) for b in GPU_MOE["budgets"] for e in (8, 16, 32, 64)
    }
    assert len({r["run_id"] for r in rows}) == len(rows) == 3 * 4 * 5
    assert all(f"_E{r['experts']}k4_" in r["run_id"] for r in rows)
    assert "large-scale defaults" in err and "isoflop.center_tokens_per_param=20.0" in err
    assert (
        out["defaults"]["scale"] == "large"
        and "Chinchilla" in out["defaults"]["taken"]["isoflop.center_tokens_per_param"]["source"]
    )
    assert not [w for w in out["warnings"] if "tokens_per_param" in w]  # the default plan is inside its stated range

    assert cli_main(["ladder", "export", str(ladder), "--out", str(tmp_path / "recipe.csv")]) == 0
    assert cli_main(["ladder", "export", str(ladder), "--out", str(tmp_path / "recipe.json")]) == 0
    capsys.readouterr()
    with open(tmp_path / "recipe.csv", newline="") as f:
        table = list(csv.DictReader(f))
    doc = json.loads((tmp_path / "recipe.json").read_text())
    assert doc["conventions"] == CONVENTIONS and len(doc["rungs"]) == len(table) == len(rows)
    assert set(table[0]) == set(doc["rungs"][0])  # the same numbers in both formats
    assert cli_main(["ladder", "export", str(ladder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rungs"] == doc["rungs"]

    for rung, row in zip(doc["rungs"], table):
        assert rung["run_id"] == row["run_id"] and float(row["flops"]) == rung["flops"]
        # The FLOPs each rung must reach: its tokens at its exact FLOPs per token, within 1% of its budget.
        assert rung["tokens"] * rung["flops_per_token"] == pytest.approx(rung["flops"], rel=1e-12)
        assert abs(rung["flops"] / rung["budget_flops"] - 1) < 0.01
        assert (
            rung["tokens"] == rung["steps"] * rung["batch_tokens"] and rung["batch_tokens"] == rung["batch_size"] * 2048
        )
        assert LARGE_SCALE_MIN_TOKENS_PER_PARAM <= rung["tokens_per_param"] <= LARGE_SCALE_MAX_TOKENS_PER_PARAM
        assert rung["tokens_per_param"] == pytest.approx(rung["tokens"] / rung["params_nonembedding"])
        assert rung["warmup_steps"] + rung["stable_steps"] + rung["decay_steps"] == rung["steps"]
        assert rung["warmup_steps"] == round(0.1 * rung["steps"]) and rung["decay_steps"] == round(0.2 * rung["steps"])
        assert rung["top_k"] == 4 and rung["granularity"] == 4.0 and rung["router_balance"] == "bias"
        assert rung["hidden_lr"] == pytest.approx(rung["lr"] * 512 / rung["d_model"])  # muP: eta / m, base width 512
        assert rung["embedding_lr"] == rung["unembedding_lr"] == rung["router_lr"] == rung["norm_lr"] == rung["lr"]
        assert (
            rung["hidden_weight_decay"] == pytest.approx(0.1 * rung["d_model"] / 512) and rung["norm_weight_decay"] == 0
        )
        assert (
            rung["logit_multiplier"] == pytest.approx(512 / rung["d_model"])
            and rung["residual_branch_multiplier"] == 1.0
        )
    # The compute-optimal centre: each curve's middle rung near Chinchilla's 20 tokens per parameter.
    for budget in GPU_MOE["budgets"]:
        curve = sorted(
            (r for r in doc["rungs"] if r["budget_flops"] == budget and r["experts"] == 32),
            key=lambda r: r["params_nonembedding"],
        )
        assert (
            10 <= curve[2]["tokens_per_param"] <= 40
            and curve[-1]["params_nonembedding"] / curve[0]["params_nonembedding"] >= 6
        )


def test_exported_multipliers_are_what_the_model_and_optimizer_apply(tmp_path, no_store, capsys):
    """Build the smallest exported rung of the 8-expert ladder with Delphi's own model and optimizer:
    its init stds, forward multipliers and the first step of every parameter group match the export."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from delphi.model.mup import param_labels
    from delphi.model.transformer import Transformer
    from delphi.train.optim import make_optimizer

    # A small vocabulary keeps the model quick to build; the multipliers do not depend on it.
    spec = {**GPU_MOE, "budgets": [1.0e17], "vocab_size": 4096, "shape": {"moe": {"experts": 8, "top_k": 4}}}
    code, _, err = _plan(tmp_path, spec, capsys)
    assert code == 0, err
    doc = export_ladder(tmp_path / "ladder")
    rung = min(doc["rungs"], key=lambda r: r["params_total"])
    cfg = load_train_config(tmp_path / "ladder" / "configs" / f"{rung['run_id']}.yaml")
    model = Transformer(cfg.model, rngs=nnx.Rngs(0))
    block, moe = model.blocks[0], model.blocks[0].ffn
    assert model.logit_mult == rung["logit_multiplier"] and model.alpha_in == rung["embedding_multiplier"]
    assert block.branch_mult == rung["residual_branch_multiplier"] and block.attn.scale == rung["attention_scale"]
    assert moe.router_mult == rung["router_logit_multiplier"]
    std = lambda x: float(np.asarray(x).std())  # noqa: E731
    assert std(model.embedding[...]) == pytest.approx(rung["init_std_embedding"], rel=0.02)
    assert std(block.attn.w_qkv[...]) == pytest.approx(rung["init_std_hidden"], rel=0.02)
    assert std(moe.router[...]) == pytest.approx(rung["init_std_router"], rel=0.05)
    assert rung["init_std_unembedding"] == 0.0 and not np.asarray(model.unembedding[...]).any()

    # One optimizer step on gradients of ones: Adam's first step is lr x factor(0) per element (its
    # direction is +-1), so each group's step is its exported LR x the schedule's first factor; the
    # decoupled decay adds lr x decay x w, zero for the norm gains and small beside it elsewhere.
    params = nnx.state(model, nnx.Param)
    tx = make_optimizer(cfg.model, cfg.optim, cfg.steps)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    labels = param_labels(params)
    first = 1.0 / rung["warmup_steps"]
    names = {
        "embedding": "embedding",
        "hidden": "hidden",
        "unembedding": "unembedding",
        "router": "router",
        "vector": "norm",
    }
    steps: dict[str, list[float]] = {}
    for label, update in zip(jax.tree.leaves(labels), jax.tree.leaves(updates)):
        steps.setdefault(label, []).append(float(np.median(np.abs(np.asarray(update)))))
    for group, name in names.items():
        assert np.median(steps[group]) == pytest.approx(rung[f"{name}_lr"] * first, rel=0.01), group
    assert rung["hidden_lr_multiplier"] == pytest.approx(512 / rung["d_model"])


@pytest.mark.parametrize("budgets", [[1e17], [1e18, 1e19], [1e20], [1e21]])
def test_the_default_plan_holds_at_any_scale(tmp_path, no_store, capsys, budgets):
    """A spec that names only its budgets: rungs around Chinchilla's 20 tokens per parameter, inside
    the stated range, no rung below one token per parameter, and no warning."""
    code, out, err = _plan(tmp_path, {"budgets": budgets}, capsys)
    assert code == 0, err
    for budget in budgets:
        curve = sorted((r for r in out["rungs"] if r["budget"] == budget), key=lambda r: r["params"])
        ratios = [r["tokens_per_param"] for r in curve]
        assert len(curve) == 5 and 10 <= ratios[2] <= 40
        assert LARGE_SCALE_MIN_TOKENS_PER_PARAM <= min(ratios) and max(ratios) <= LARGE_SCALE_MAX_TOKENS_PER_PARAM
        assert all(abs(float(r["flops_error"])) < 0.01 for r in curve)
    assert out["warnings"] == [] and out["health_warnings"] == []


def test_a_plan_outside_its_stated_range_says_so(tmp_path, no_store, capsys):
    code, out, err = _plan(tmp_path, {**GPU_MOE, "bounds": {"tokens_per_param": [10, 100]}}, capsys)
    assert code == 0
    (line,) = [w for w in out["warnings"] if w.startswith("bounds.tokens_per_param")]
    assert "bounds.tokens_per_param=[10, 100]:" in line and "C1e17_d" in line and "tokens per parameter" in line
    assert f"warning: {line}" in err


def test_the_shipped_cpu_specs_take_no_large_scale_default_and_the_default_plan_is_unchanged(tmp_path):
    for path in SHIPPED:
        assert large_scale_fills(yaml.safe_load(path.read_text())) == {}, path.name
    from delphi.ladder.manifest import write_ladder

    spec = load_ladder_spec(DEFAULT)
    write_ladder(spec, plan_ladder(spec), tmp_path)
    digest = lambda *paths: hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()  # noqa: E731
    # Planned from main before the large-scale defaults existed (the default study's ladder).
    assert digest(tmp_path / "manifest.csv") == "c551929ee1c018a4d926655dfc5b033f9a41ad61a8de44e24223b058af622e7c"
    assert digest(tmp_path / "ladder.yaml") == "825c2783de0e1cae7ee20b32400bdb724894687c37b1e461dfc4ce44fc42cf01"
    assert (
        digest(*sorted((tmp_path / "configs").glob("*.yaml")))
        == "3f9843759acee39cca13e7ac585f5d7f24ab141a909801e512ab001299672903"
    )


def test_every_large_scale_default_names_a_source_and_a_real_key():
    from delphi.study.spec_reference import ladder_keys

    keys = {k.key for k in ladder_keys()}
    for key, default in LARGE_SCALE_DEFAULTS.items():
        assert key in keys and len(default.source) > 20, key
    # `defaults: cpu` keeps the CPU defaults at any budget; `defaults: large` takes the others below 1e15.
    assert ladder_spec_from_dict({"budgets": [1e19], "defaults": "cpu", "isoflop": {}}).seq_len == 128
    assert ladder_spec_from_dict({"budgets": [1e13], "defaults": "large"}).seq_len == 2048


def test_unknown_keys_are_refused_and_unused_keys_named(tmp_path, no_store, capsys):
    # A key at the wrong level is no key: refused, naming it and the keys allowed there.
    for bad, key in (
        ({"head_dim": 128}, "head_dim"),
        ({"depth": {"rule": "marin"}}, "depth"),
        ({"shape": {"depth": {"rules": "marin"}}}, "shape.depth.rules"),
        ({"shape": {"moe": {"expert": 8}}}, "shape.moe.expert"),
    ):
        code, _, err = _plan(tmp_path, {**GPU_MOE, **bad}, capsys, out=f"x_{key}")
        assert code == 2 and f"{key}: unknown key (expected one of:" in err and not (tmp_path / f"x_{key}").exists()
    # Real keys at their place; one the spec's other choices leave unused is named.
    spec = {
        **GPU_MOE,
        "shape": {
            "head_dim": 128,
            "n_heads": 8,
            "depth": {"rule": "marin", "ratio": 32},
            "moe": {"experts": 32, "top_k": 4},
        },
    }
    code, out, err = _plan(tmp_path, spec, capsys)
    assert code == 0, err
    assert "shape.head_dim is set but unused: shape.n_heads fixes the head count" in out["warnings"]
    assert "shape.depth.ratio is set but unused: shape.depth.rule is marin" in out["warnings"]


def test_a_gate_forced_by_a_name_that_is_no_gate_is_refused(tmp_path):
    from delphi.errors import DelphiError
    from delphi.study.spec import load_study

    study = tmp_path / "study.yaml"
    (tmp_path / "ladder.yaml").write_text(DEFAULT.read_text())
    study.write_text(yaml.safe_dump({"ladder": "ladder.yaml", "gates": {"force": {"hero_rnages": "a typo"}}}))
    with pytest.raises(DelphiError, match=r"gates.force.hero_rnages: no such gate \(expected one of: .*hero_ranges"):
        load_study(study)


def test_a_default_cap_that_binds_is_printed(tmp_path, no_store, capsys):
    """At CPU scale shape.depth.max_layers (8) caps wide rungs: `ladder plan` says so; set, it is silent."""
    raw = yaml.safe_load((ROOT / "studies" / "ladder_tiny.yaml").read_text())
    raw.update(budgets=[1e12, 1e13])
    raw["shape"]["depth"] = {"rule": "ratio", "ratio": 4}  # d48 would get 12 layers
    code, out, err = _plan(tmp_path, raw, capsys)
    assert code == 0
    (note,) = [n for n in out["notes"] if n.startswith("shape.depth.max_layers")]
    assert "shape.depth.max_layers=8 (the default) caps" in note and "the rule gives" in note and f"note: {note}" in err
    raw["shape"]["depth"]["max_layers"] = 8
    code, out, _ = _plan(tmp_path, raw, capsys, out="set")
    assert code == 0 and not [n for n in out["notes"] if n.startswith("shape.depth.max_layers")]


@pytest.mark.parametrize(
    "change, key",
    [
        # the plan: 135M-2.5B-parameter rungs at 1e17 FLOPs, at 0-1 tokens per parameter
        (
            {
                "shape": {"widths": [1024, 1536, 2048, 3072, 4096]},
                "batch": {"min_steps": 16},
                "isoflop": {"min_span": 2},
            },
            "bounds.min_tokens_per_param: rung C1e17_d4096",
        ),
        ({"shape": {"n_heads": 3, "widths": [512, 768, 1024]}}, "shape.widths[0]: 512 does not split into 3 heads"),
        ({"shape": {"head_dim": 63}}, "shape.head_dim: must be even"),
        ({"shape": {"moe": {"experts": [8, 8]}}}, "shape.moe.experts: a sweep's values must be distinct"),
        ({"shape": {"moe": {"experts": []}}}, "shape.moe.experts: an empty list sweeps nothing"),
        ({"shape": {"moe": {"experts": [4, 16], "top_k": 8}}}, "shape.moe.top_k: must be in [1, experts=4]"),
        ({"bounds": {"tokens_per_param": [100, 10]}}, "bounds.tokens_per_param: expected [low, high]"),
        ({"budgets": [1.0e30]}, "batch.max_steps"),
    ],
)
def test_an_absurd_plan_exits_2_with_one_line_and_writes_nothing(tmp_path, no_store, capsys, change, key):
    data = {**GPU_MOE, "budgets": [1.0e17], **change}
    code, _, err = _plan(tmp_path, data, capsys)
    assert code == 2 and key in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "ladder").exists()


def test_experts_and_granularity_sweep_inside_one_ladder(tmp_path, no_store, capsys):
    raw = yaml.safe_load((ROOT / "studies" / "ladder_tiny.yaml").read_text())
    raw["budgets"] = [1e12, 3e12]
    raw["isoflop"]["min_span"] = 4  # MoE shapes of this family spread less in N than its dense ones
    raw["shape"]["moe"] = {"experts": [4, 8], "top_k": 2, "granularity": [2, 4]}
    code, out, err = _plan(tmp_path, raw, capsys)
    assert code == 0, err
    rows = read_manifest(tmp_path / "ladder")
    cells = {(float(r["budget"]), int(r["experts"]), float(r["granularity"])) for r in rows}
    assert cells == {(b, e, g) for b in (1e12, 3e12) for e in (4, 8) for g in (2.0, 4.0)}
    assert len({r["run_id"] for r in rows}) == len(rows) == 2 * 4 * 5
    assert {r["run_id"].split("_")[3] for r in rows} == {"E4k2G2", "E4k2G4", "E8k2G2", "E8k2G4"}
    for row in rows:  # each rung's config trains its own expert count and width
        cfg = load_train_config(tmp_path / "ladder" / row["config"])
        assert cfg.model.moe.experts == int(row["experts"]) and cfg.model.d_ff / cfg.model.moe.d_expert == float(
            row["granularity"]
        )
    # One expert count, no granularity sweep: run ids as before (no G tag).
    raw["shape"]["moe"] = {"experts": [4, 8], "top_k": 2}
    code, out, _ = _plan(tmp_path, raw, capsys, out="experts_only")
    assert code == 0 and all("G" not in r["run_id"].split("_")[3] for r in out["rungs"])
    # A command that needs one family says why it cannot take a sweep.
    code = cli_main(["ladder", "family", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "family.json")])
    assert code == 2 and "shape.moe: the spec sweeps experts [4, 8]" in capsys.readouterr().err


def test_export_refuses_a_bad_out_and_needs_a_planned_ladder(tmp_path, no_store, capsys):
    code, _, _ = _plan(tmp_path, {"budgets": [1e17]}, capsys)
    ladder = tmp_path / "ladder"
    for args, words in (
        (["--out", str(tmp_path / "x.txt")], "expected a file ending in .csv or .json"),
        ([], "give --out FILE.csv or FILE.json, or --json"),
        (["--out", str(ladder / "manifest.csv")], "manifest.csv"),
    ):
        assert cli_main(["ladder", "export", str(ladder), *args]) == 2
        assert words in capsys.readouterr().err
    assert cli_main(["ladder", "export", str(tmp_path / "nowhere"), "--json"]) == 2
    assert "no manifest.csv" in capsys.readouterr().err
    assert not list(tmp_path.glob("x.*"))


def test_docs_export_example_matches_an_exported_rung(tmp_path, no_store, capsys):
    """docs/export.md's worked example quotes a rung of the 1e17 GPU ladder: its numbers are the export's."""
    spec = ROOT / "docs" / "examples" / "gpu_moe_ladder.yaml"
    assert cli_main(["ladder", "plan", str(spec), "--out", str(tmp_path / "ladder")]) == 0
    capsys.readouterr()
    rung = next(r for r in export_ladder(tmp_path / "ladder")["rungs"] if r["run_id"] == "C1e17_d448_L5_E32k4_s0")
    text = (ROOT / "docs" / "export.md").read_text()
    for key in ("d_model", "n_layers", "n_heads", "steps", "batch_size", "warmup_steps", "decay_steps"):
        assert f"{key} = {rung[key]}" in text, key
    for key in ("hidden_lr", "embedding_lr", "logit_multiplier", "init_std_hidden", "hidden_weight_decay"):
        assert f"{key} = {rung[key]:.6g}" in text, key
    assert math.isclose(rung["tokens"] * rung["flops_per_token"], 1e17, rel_tol=0.01)


@pytest.mark.slow  # ~1.5 min on 2 busy cores: two MoE rungs compiled and trained
def test_an_expert_sweep_trains_and_collects_each_rung_with_its_own_experts(tmp_path, monkeypatch):
    """A real micro ladder sweeping experts: `ladder run` trains every rung, `ladder collect` gives
    each row its own experts and granularity (and no single FLOPs family beside the table)."""
    from micro_ladder import micro_spec

    from delphi.ladder.collect import collect_ladder, family_path, write_results
    from delphi.ladder.manifest import write_ladder
    from delphi.ladder.runner import run_ladder

    monkeypatch.setenv("DELPHI_PEAK_FLOPS_F32", "1e11")
    monkeypatch.setenv("DELPHI_JAX_CACHE", str(tmp_path / "jax-cache"))
    raw = micro_spec(tmp_path, [1e9])
    raw["shape"]["moe"] = {"experts": [2, 4], "top_k": 1, "granularity": 2, "capacity_factor": 4.0}
    spec = ladder_spec_from_dict(raw)
    ladder = tmp_path / "ladder"
    write_ladder(spec, plan_ladder(spec), ladder)
    summary = run_ladder(ladder, workers=1, progress=False)
    assert summary["completed"] == 2 and not summary["failed"]
    table = collect_ladder(ladder)
    write_results(table, tmp_path / "results.csv")
    assert sorted(table["experts"]) == [2, 4] and set(table["granularity"]) == {2.0}
    assert table["loss"].between(0.1, 6.0).all() and not family_path(tmp_path / "results.csv").exists()


@pytest.mark.parametrize(
    "data",
    [
        GPU_MOE,
        {**GPU_MOE, "bounds": {"tokens_per_param": None, "min_tokens_per_param": None}},
        {**GPU_MOE, "isoflop": {"center_coefficient": 0.1, "center_exponent": 0.5}, "defaults": "auto"},
        {"budgets": [1e12], "defaults": "large"},
        {"budgets": [1e17], "defaults": "cpu", "isoflop": {}},
    ],
)
def test_ladder_yaml_reads_back_as_the_spec_it_was_written_from(data):
    from delphi.ladder.spec import ladder_spec_to_dict

    spec = ladder_spec_from_dict(data)
    assert ladder_spec_from_dict(yaml.safe_load(yaml.safe_dump(ladder_spec_to_dict(spec)))) == spec
