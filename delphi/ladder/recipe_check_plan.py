"""The recipe check's plan: every run it trains, from the smallest rung to the planned hero, and the
runs of earlier checks (--prior) it reuses as LR-sweep points of a retuned recipe; written as a
ladder directory so that `ladder run` trains it (the method: docs/design.md and docs/notebook.md).

A prior run is reused at a point when its trainer config equals the new plan's there in everything
but optim.lr and what names or places a run (`reuse_identity`); it enters the point's sweep at
x = its LR / the new recipe's LR there. The recipe's own value (x 1) is always trained, at every seed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError
from delphi.io import atomic_write_text, atomic_write_yaml
from delphi.ladder.hero import expected_depths, plan_hero
from delphi.ladder.manifest import (
    CONFIG_DIR,
    MANIFEST_FILE,
    RUNS_DIR,
    SPEC_FILE,
    manifest_csv,
    manifest_row,
    read_manifest,
    write_ladder,
)
from delphi.ladder.plan import Rung, expected_optimum, make_rung, plan_ladder, shape_for_width
from delphi.ladder.recipe import recipe_batch_seqs
from delphi.ladder.recipe_check import MAX_COMPUTE_RATIO, PLAN_FILE, REACH_SLACK_REL, SAME_LR_REL, CheckRun, check_spec
from delphi.ladder.spec import LadderSpec, ladder_spec_to_dict, load_ladder_spec
from delphi.ladder.wall_estimate import estimate_wall_s
from delphi.model.flops import flops_per_token
from delphi.train.config import TrainConfig, load_train_config, train_config_to_dict
from delphi.train.rundir import read_status

# A grid lr multiplier is covered by a prior run (--prior) whose LR lies within this factor of it:
# sqrt(2), half the default grid's factor-2 step, i.e. the prior is nearer this multiplier than any
# other of the grid. The union then holds a sample in every half-octave bin of the grid, with
# neighbouring LRs at most 4x apart and either end of the span moved in by at most half an octave.
# A tighter match buys no accuracy (every sample enters the fit at its own x) but trains more.
PRIOR_MATCH = 2.0**0.5
# A batch-sweep run is reused only this close to the recipe's LR, since it stands AT the recipe's LR:
# at the curvature the LR sweeps measure, 1/6 of an octave off costs a small fraction of the gate's
# MAX_LOST_FRAC (the measured curvature: docs/notebook.md).
BATCH_PRIOR_MATCH = 2.0 ** (1.0 / 6.0)
# Trainer-config keys that name or place a run rather than set its maths (the trainer's own
# MATHS_FREE_KEYS, delphi.train.trainer, and the bookkeeping name and wandb), plus the seeds: a prior
# run equal to a planned one outside these and optim.lr trains the same experiment at another LR.
RUN_IDENTITY_KEYS = ("name", "wandb", "seed", "mesh", "eval_batch_size", "checkpoint_every_s", "device", "attention")
# A prior run in one of these states has its result (diverged: the LR is too high, NaN loss).
PRIOR_ENDED = ("completed", "diverged")


@dataclass(frozen=True)
class PriorRun:
    """A run of an earlier recipe check (--prior), with the trainer config it trained."""

    source: str  # the --prior directory as given
    run_id: str
    train: TrainConfig
    ended: bool  # completed or diverged: its result is on disk


def planned_hero(spec: LadderSpec) -> Rung:
    """The plan's preflight hero at the largest of recipe.check.hero_computes: the family shape at
    the spec's expected N*, at a depth the ladder trains near its optimum (`plan_hero`)."""
    check = check_spec(spec)
    compute = max(check.hero_computes)
    return plan_hero(spec, expected_optimum(spec, compute), compute, depths=expected_depths(spec))


def check_reach(spec: LadderSpec, rungs: list[Rung], hero: Rung) -> None:
    """DelphiError naming the key when the check's points do not span the smallest rung to the hero."""
    c = check_spec(spec)
    smallest = min(rungs, key=lambda r: (r.model.d_model, r.tokens))
    if max(c.widths) < hero.model.d_model:
        raise DelphiError(
            f"recipe.check.widths: the widest point (d{max(c.widths)}) does not reach the planned hero's "
            f"width d{hero.model.d_model} ({hero.run_id}); add d{hero.model.d_model} or wider"
        )
    if max(c.horizons) * (1 + REACH_SLACK_REL) < hero.tokens:
        raise DelphiError(
            f"recipe.check.horizons: the longest horizon ({max(c.horizons):.3g} tokens) does not reach the "
            f"planned hero's {hero.tokens:.3g} tokens ({hero.run_id}); add a horizon >= {hero.tokens:.3g}"
        )
    if min(c.widths) > smallest.model.d_model:
        raise DelphiError(
            f"recipe.check.widths: the narrowest point (d{min(c.widths)}) is wider than the smallest rung "
            f"(d{smallest.model.d_model}, {smallest.run_id})"
        )
    shortest = min(r.tokens for r in rungs)
    if min(c.horizons) > shortest * (1 + REACH_SLACK_REL) and c.width_tokens > shortest * (1 + REACH_SLACK_REL):
        raise DelphiError(
            f"recipe.check.width_tokens: neither it ({c.width_tokens:.3g}) nor the shortest horizon "
            f"({min(c.horizons):.3g}) reaches down to the ladder's shortest rung ({shortest:.3g} tokens)"
        )


def _point_rung(
    spec: LadderSpec, d_model: int, tokens: float, seed: int, run_id: str, batch: int | None = None
) -> Rung:
    model = shape_for_width(spec, d_model)
    rung = make_rung(spec, model, tokens * flops_per_token(model, spec.seq_len), seed, run_id=run_id, batch=batch)
    if rung is None:  # pragma: no cover - the recipe always finds a batch
        raise DelphiError(f"recipe.check: no run at d{d_model}@{tokens:.3g}")
    return rung


def _with_lr(rung: Rung, multiplier: float) -> Rung:
    """The rung with its projection LR (AdamH) or its LR (AdamW) times `multiplier`."""
    if multiplier == 1.0:
        return rung
    lr = rung.train.optim.lr * multiplier
    train = dataclasses.replace(rung.train, optim=dataclasses.replace(rung.train.optim, lr=lr))
    return dataclasses.replace(rung, hp=dataclasses.replace(rung.hp, lr=lr), train=train)


def _renamed(rung: Rung, run_id: str) -> Rung:
    return dataclasses.replace(rung, run_id=run_id, train=dataclasses.replace(rung.train, name=run_id))


def reuse_identity(train: TrainConfig) -> str:
    """The trainer config as canonical JSON without optim.lr and RUN_IDENTITY_KEYS (data.seed too):
    two runs with the same identity train the same experiment, at their own LR and seed."""

    data = train_config_to_dict(train)
    for key in RUN_IDENTITY_KEYS:
        data.pop(key, None)
    data["data"] = {k: v for k, v in data["data"].items() if k != "seed"}
    data["optim"] = {k: v for k, v in data["optim"].items() if k != "lr"}
    return json.dumps(data, sort_keys=True, default=str)


def _lr_ratio(prior_lr: float, recipe_lr: float, grid: Sequence[float]) -> float:
    """prior_lr / recipe_lr, snapped to a grid multiplier it equals up to float rounding."""
    x = prior_lr / recipe_lr
    return next((float(m) for m in grid if abs(x / m - 1) <= SAME_LR_REL), x)


def _within(x: float, m: float, factor: float) -> bool:
    return abs(math.log(x / m)) <= math.log(factor) + SAME_LR_REL


def _first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """The dotted key of the first place two plain-data trees differ (None when equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            found = _first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
        return None
    return None if a == b else (where or "(root)")


# Spec keys that only choose the ladder's rungs, never a check run's config: a ladder that grows a
# budget keeps its checks, as priors and in place.
PLACEMENT_KEYS = ("budgets", "isoflop")


def check_subject(spec: LadderSpec) -> dict:
    """The spec as data without its placement (PLACEMENT_KEYS) and its recipe's check: what an
    existing check directory must share with the spec that extends it."""

    data = ladder_spec_to_dict(spec)
    for key in PLACEMENT_KEYS:
        data.pop(key, None)
    if isinstance(data.get("recipe"), dict):
        data["recipe"] = {k: v for k, v in data["recipe"].items() if k != "check"}
    return data


def _outside_constants(spec: LadderSpec) -> dict:
    """`check_subject` without the name and the recipe's constants: what a prior check must share
    with this one (its runs' configs decide the rest, run by run)."""
    data = check_subject(spec)
    data.pop("name", None)
    if spec.recipe is not None:
        constants = spec.recipe.constants()
        data["recipe"] = {k: v for k, v in data["recipe"].items() if k not in constants}
    return data


def load_priors(spec: LadderSpec, dirs: Sequence[str | Path], out: str | Path | None = None) -> list[PriorRun]:
    """Every run planned in the recipe-check directories `dirs` (--prior), with its trainer config;
    DelphiError (exit 2) naming --prior and the directory for one that is not a recipe check of
    `spec` outside the recipe's constants, or is `out`. A run identical to an earlier one (same
    config but the name) is counted once."""

    priors: list[PriorRun] = []
    seen_dirs: set[Path] = set()
    seen_runs: set[str] = set()
    for given in dirs:
        d = Path(given)
        if not (d / PLAN_FILE).is_file():
            raise DelphiError(
                f"--prior {given}: not a recipe-check directory (no {PLAN_FILE}); give the --out of an "
                "earlier `delphi ladder recipe-check`"
            )
        if out is not None and d.resolve() == Path(out).resolve():
            raise DelphiError(
                f"--prior {given}: is the --out directory; a prior is an earlier check of other recipe constants"
            )
        if d.resolve() in seen_dirs:
            continue
        seen_dirs.add(d.resolve())
        differs = _first_difference(_outside_constants(load_ladder_spec(d / SPEC_FILE)), _outside_constants(spec))
        if differs is not None:
            raise DelphiError(
                f"--prior {given}: a recipe check of another ladder spec ({SPEC_FILE} differs at "
                f"{differs}, outside the recipe's constants and check); its runs cannot be reused"
            )
        for row in read_manifest(d):
            run_dir = d / RUNS_DIR / row["run_id"]
            path = run_dir / "config.yaml" if (run_dir / "config.yaml").is_file() else d / row["config"]
            train = load_train_config(path)
            whole = json.dumps({**train_config_to_dict(train), "name": None}, sort_keys=True, default=str)
            if whole in seen_runs:
                continue
            seen_runs.add(whole)
            status = (read_status(run_dir) or {}).get("status") if run_dir.is_dir() else None
            priors.append(PriorRun(str(given), row["run_id"], train, status in PRIOR_ENDED))
    return priors


def plan_check(spec: LadderSpec, priors: Sequence[PriorRun] = ()) -> tuple[list[Rung], list[CheckRun]]:
    """Every run the recipe check trains (deduplicated by run id) and what each run it uses measures:
    its own, and the prior runs (`load_priors`) it reuses in place of multipliers they cover."""
    c = check_spec(spec)
    points = [("width", d, c.width_tokens) for d in sorted(set(c.widths))]
    points += [("horizon", c.horizon_width, t) for t in sorted(set(c.horizons))]
    rungs: dict[str, Rung] = {}
    runs: list[CheckRun] = []
    by_identity: dict[str, list[PriorRun]] = {}
    for prior in priors:
        by_identity.setdefault(reuse_identity(prior.train), []).append(prior)

    def reusable(base: Rung, grid: Sequence[float]) -> list[tuple[PriorRun, float]]:
        """The priors equal to `base` but for LR and seed, with their LR in units of base's."""
        return [
            (p, _lr_ratio(p.train.optim.lr, base.train.optim.lr, grid))
            for p in by_identity.get(reuse_identity(base.train), [])
        ]

    def add(kind: str, d: int, tokens: float, m: float, b: float, seed: int, batch: int | None) -> None:
        base = _point_rung(spec, d, tokens, seed, "tmp", batch)
        run_id = f"RC_d{d}_L{base.model.n_layers}_T{tokens:.3g}_B{base.batch_size}_x{m:g}_s{seed}"
        rungs.setdefault(run_id, _renamed(_with_lr(base, m), run_id))
        runs.append(CheckRun(run_id, kind, f"d{d}@{tokens:.3g}", d, float(tokens), float(m), float(b), seed))

    def add_prior(kind: str, d: int, tokens: float, prior: PriorRun, x: float, b: float) -> None:
        runs.append(
            CheckRun(
                prior.run_id, kind, f"d{d}@{tokens:.3g}", d, float(tokens), x, float(b), prior.train.seed, prior.source
            )
        )

    multipliers = sorted(set(c.lr_multipliers))
    for kind, d, tokens in points:
        reused = reusable(_point_rung(spec, d, tokens, c.seeds[0], "tmp"), multipliers) if by_identity else []
        for m in multipliers:
            if m != 1.0 and any(_within(x, m, PRIOR_MATCH) for _, x in reused):
                continue  # a prior covers it; the recipe's own value is always trained
            for seed in c.seeds if m == 1.0 else c.seeds[:1]:
                add(kind, d, tokens, m, 1.0, seed, None)
        for prior, x in sorted(reused, key=lambda px: (px[1], px[0].train.seed)):
            add_prior(kind, d, tokens, prior, x, 1.0)
    widest = max(c.widths)
    longest = max(c.horizons)
    assert spec.recipe is not None
    for d, tokens in ((widest, c.width_tokens), (c.horizon_width, longest)):
        rule, _ = recipe_batch_seqs(spec.recipe, tokens, spec.seq_len, d)
        for b in sorted(set(c.batch_multipliers)):
            seqs = max(1, round(rule * b))
            if seqs == rule:
                continue
            near = [
                (p, x)
                for p, x in (
                    reusable(_point_rung(spec, d, tokens, c.seeds[0], "tmp", seqs), (1.0,)) if by_identity else []
                )
                if _within(x, 1.0, BATCH_PRIOR_MATCH)
            ]
            if not near:
                add("batch", d, tokens, 1.0, seqs / rule, c.seeds[0], seqs)
            for prior, x in near:
                add_prior("batch", d, tokens, prior, x, seqs / rule)
    return list(rungs.values()), runs


def check_summary(
    spec: LadderSpec, rungs: list[Rung], runs: Sequence[CheckRun] = (), priors: Sequence[PriorRun] = ()
) -> dict[str, Any]:
    """Compute and wall of the check against the study's (ladder + the runs beyond it), and the hero;
    with priors, the runs and FLOPs it reuses from each (`runs`: the plan's, naming their source)."""
    c = check_spec(spec)
    ladder = plan_ladder(spec)
    hero = planned_hero(spec)
    check_reach(spec, ladder, hero)
    check_flops = sum(r.flops for r in rungs)
    study_flops = sum(r.flops for r in ladder) + sum(c.hero_computes)
    return {
        "hero": {
            "run_id": hero.run_id,
            "d_model": hero.model.d_model,
            "n_layers": hero.model.n_layers,
            "tokens": float(hero.tokens),
            "flops": hero.flops,
            "batch_size": hero.batch_size,
            "steps": hero.steps,
        },
        "runs": len(rungs),
        "check_flops": check_flops,
        "ladder_flops": sum(r.flops for r in ladder),
        "study_flops": study_flops,
        "compute_ratio": check_flops / study_flops,
        "max_compute_ratio": MAX_COMPUTE_RATIO,
        "check_wall_s_estimate": estimate_wall_s(rungs),
        "ladder_wall_s_estimate": estimate_wall_s(ladder),
        **prior_summary(runs, priors),
    }


def prior_summary(runs: Sequence[CheckRun], priors: Sequence[PriorRun]) -> dict[str, Any]:
    """Per --prior directory (as given, in order): runs reused, their FLOPs, and how many have not
    ended yet (the check's report lacks their losses until that directory's check finishes them)."""
    by_key = {(p.source, p.run_id): p for p in priors}
    used = {(r.source, r.run_id) for r in runs if r.source}
    out: list[dict[str, Any]] = []
    for source in dict.fromkeys(p.source for p in priors):
        mine = [by_key[k] for k in sorted(used) if k[0] == source]
        out.append(
            {
                "dir": source,
                "runs": len(mine),
                "flops": sum(p.train.flops for p in mine),
                "not_ended": sum(not p.ended for p in mine),
            }
        )
    return {"priors": out, "reused_runs": sum(p["runs"] for p in out), "reused_flops": sum(p["flops"] for p in out)}


def write_check(
    spec: LadderSpec, out: str | Path, priors: Sequence[str | Path] = ()
) -> tuple[list[Rung], list[CheckRun], dict[str, Any]]:
    """Plan the check into `out` (a ladder directory). A rerun resumes it; a directory holding a check
    of the same spec and recipe with other points is extended (its runs stay, new points join), so a
    check short of the fitted hero grows where it stands. `priors`: earlier checks' directories
    (--prior) whose runs stand in for multipliers they cover (`plan_check`); the plan depends on what
    they planned, not on how far they trained, so a rerun with the same priors plans the same."""

    prior_runs = load_priors(spec, priors, out)
    rungs, runs = plan_check(spec, prior_runs)
    summary = check_summary(spec, rungs, runs, prior_runs)
    out = Path(out)
    if not (out / MANIFEST_FILE).is_file():
        write_ladder(spec, rungs, out)
    else:
        if check_subject(load_ladder_spec(out / SPEC_FILE)) != check_subject(spec):
            raise DelphiError(
                f"--out: {out} holds a recipe check of another ladder spec or recipe ({SPEC_FILE} differs "
                "outside recipe.check, budgets and isoflop); choose a new directory"
            )
        rows = {row["run_id"]: row for row in read_manifest(out)}
        for rung in rungs:
            if rung.run_id not in rows:
                atomic_write_yaml(out / CONFIG_DIR / f"{rung.run_id}.yaml", train_config_to_dict(rung.train))
                rows[rung.run_id] = manifest_row(rung)
        atomic_write_yaml(out / SPEC_FILE, ladder_spec_to_dict(spec))
        atomic_write_text(out / MANIFEST_FILE, manifest_csv(list(rows.values())))
    atomic_write_text(
        Path(out) / PLAN_FILE,
        json.dumps({**summary, "check_runs": [dataclasses.asdict(r) for r in runs]}, indent=2) + "\n",
    )
    return rungs, runs, summary
