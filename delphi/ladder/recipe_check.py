"""How much loss does the recipe leave on the table, from the smallest rung to the planned hero?
`delphi ladder recipe-check SPEC --out DIR` (issue 29; Marin's recipe checks: the recipe's values
must sit in the low-loss region at the extremes, not only at the centre).

The sweep (the spec's `recipe.check`, every run planned by `delphi.ladder.plan.make_rung`, so by
the recipe itself):

    width points    each of check.widths at check.width_tokens tokens (a short horizon)
    horizon points  each of check.horizons (tokens) at check.horizon_width
    at every point  the projection LR x each of check.lr_multipliers (first seed), and
                    check.seeds at multiplier 1
    batch sweep     at the widest and the longest point: the recipe's batch x check.batch_multipliers,
                    every other hyperparameter the recipe's at that batch

    per point       quadratic in log2 LR through every LR within LR_FIT_NEIGHBOURS grid steps of
                    the best (seed means) -> the fitted optimum;
                    lost = the curve at the recipe's LR / the curve's minimum - 1 (the gate's);
                    observed = the recipe's seed mean / the lower of the best run and the curve's
                    minimum - 1, reported beside it with the seed sd: it counts seed noise (a
                    second seed 0.014 nats above the first read as +0.78% at an optimum 1.05x away,
                    paper/next/v8/recipe_recheck) and is the gate's only where no interior fit
                    brackets the recipe's value (then a lower bound)
    trend           lost against log width (width points) and log tokens (horizon points), each a
                    least-squares line evaluated at the planned hero; the larger is "carried"
    drift           log m* = a + b log(d / horizon_width) + c log(T / T0): the LR optimum in units
                    of the recipe's; the recipe's eta0 x e^a and horizon exponent p - c fit the sweep

Priors (`--prior DIR`, repeatable): a retune of lr, horizon_exponent or width_exponent moves only
the projection LR of every run (shape, tokens, Adam-group LR, eps, beta2 and schedule follow from
(d, T, B), not from eta; the batch too, unless the lr_max cap now halves it), so an earlier check of
the same ladder spec under other recipe constants is an LR sweep of the new recipe too. A prior run
is reused at a point when its trainer config (its run dir's config.yaml, else the one its check
planned) equals the new plan's at that point in everything but optim.lr and what names or places a
run (`reuse_identity`: name, seed, data.seed, wandb and the trainer's maths-free keys); it enters
the point's sweep at x = its LR / the new recipe's LR there. Seeds are samples: a prior of any seed
counts, each x's losses are averaged. At every point the check still trains the recipe's value (x 1)
at every seed -- what the gate judges, from this check's own runs only -- plus each lr multiplier no
prior lies within PRIOR_MATCH (sqrt 2) of; a batch-sweep run is reused when a prior at that batch
lies within BATCH_PRIOR_MATCH (2^(1/6)) of the recipe's LR. Reused runs stay where they are: the
plan, the report and the runs CSV name each one's `source` (the --prior directory as given, resolved
against the working directory when analysed; "" = trained here). A prior must be a recipe-check
directory (its plan file) of the same ladder spec outside the recipe's constants and its check
points (exit 2 otherwise); its own priors are not followed (pass them too). What a prior covers
depends on what it planned, not on how far it trained (a rerun with the same priors plans the same);
reused runs not yet ended there are counted (`not_ended`) and lack a loss here until that
directory's check finishes them.

The check must reach the planned hero (the plan's preflight hero at the largest of
check.hero_computes): a check narrower than its width or shorter than its tokens is refused
(exit 2, naming recipe.check.widths or recipe.check.horizons). Its runs form a ladder directory,
so `ladder run`'s workers, resume and progress apply: a rerun trains only what is missing, and a rerun
with more points (e.g. a longer horizon for the fitted hero) extends the same directory.
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
from delphi.io import atomic_write_text
from delphi.ladder.lr_calibration import completed_val_loss
from delphi.ladder.plan import (
    RUNS_DIR,
    Rung,
    expected_depths,
    expected_optimum,
    make_rung,
    plan_hero,
    plan_ladder,
    shape_for_width,
)
from delphi.ladder.recipe import RecipeCheckSpec, recipe_batch_seqs
from delphi.ladder.spec import LadderSpec
from delphi.model.flops import flops_per_token
from delphi.train.config import TrainConfig

REPORT_FILE = "recipe_check.json"
PLAN_FILE = "recipe_check_plan.json"
# Issue 29: the check may cost at most a fifth of the study it checks (ladder + runs beyond it).
MAX_COMPUTE_RATIO = 0.2
# Gate `recipe` (issue 29): no point may lose more than this share of its loss to the recipe's LR or
# batch, and the trend in width or horizon carried to the hero may not either.
MAX_LOST_FRAC = 0.005
# The quadratic in log2 LR uses the best multiplier and two on each side (five points on the
# default grid); in log2 batch, the best and one on each side.
# The fit takes every x within that many grid steps (the check's own multipliers' median step in
# log2) of the best: on the check's grid exactly the neighbours above, and with priors, whose LRs
# fall between and beyond the grid, every sample in the same span of LR.
LR_FIT_NEIGHBOURS = 2
BATCH_FIT_NEIGHBOURS = 1
# A grid lr multiplier is covered by a prior run (--prior) whose LR lies within this factor of it:
# sqrt(2), half the default grid's factor-2 step, i.e. the prior is nearer this multiplier than any
# other of the grid. The union then holds a sample in every half-octave bin of the grid -- at least
# the grid's density over its span -- with neighbouring LRs at most 4x apart and either end of the
# span moved in by at most half an octave. A tighter match buys no accuracy (every sample enters the
# fit at its own x) but trains more: on runs/v8_check, a retune of recipe.lr by 1.5x would train all
# 46 runs again at 2^(1/3), and 25 (the recipe's seeds, 4x and the batch sweep) at sqrt(2).
PRIOR_MATCH = 2.0**0.5
# A batch-sweep run is reused only this close to the recipe's LR, since it stands AT the recipe's LR:
# at the sweeps' curvature (0.023-0.030 nats per octave^2 of LR at d16@6e7 and d192@7e5, the first
# points of runs/v8_check), 1/6 of an octave off costs <= 0.0008 nats, 0.05% of the loss, a tenth of
# the gate's MAX_LOST_FRAC.
BATCH_PRIOR_MATCH = 2.0 ** (1.0 / 6.0)
# A prior's LR ratio this close (relative) to a grid multiplier is that multiplier: the recipe's LR is
# a product of factors, so the same LR computed two ways differs in the last bits.
SAME_LR_REL = 1e-9
# Trainer-config keys that name or place a run rather than set its maths (the trainer's own
# MATHS_FREE_KEYS, delphi.train.trainer, and the bookkeeping name and wandb), plus the seeds: a prior
# run equal to a planned one outside these and optim.lr trains the same experiment at another LR.
RUN_IDENTITY_KEYS = ("name", "wandb", "seed", "mesh", "eval_batch_size", "checkpoint_every_s", "device", "attention")
# A prior run in one of these states has its result (diverged: the LR is too high, NaN loss).
PRIOR_ENDED = ("completed", "diverged")
# The hero may train this share more tokens than the longest horizon (or be this share wider than the
# widest point) and still count as reached: the plan rounds steps to its step quantum (spec.tolerance).
REACH_SLACK_REL = 0.01
# Wall estimate on the project's 2-core CPUs, refitted on the eighth edition's own runs (181 completed
# runs of its three recipe checks and its ladder, AdamH, f32, two workers at once, on the 2-core AMD
# EPYC; benchmarks/wall_estimate.py -> benchmarks/results/2026-12-04-wall-estimate): train time per
# step = 3.9 ms + FLOPs per step / 15.1 GFLOP/s per worker, plus 36 s per run outside training
# (compile, evaluations, checkpoints; mean). Its total is 1.05x those runs' wall; the constants
# before it (paper/v2-v7: 4.2 ms, 46.2 GFLOP/s, 22 s) gave 0.44x, and planned stages ~3x short.
STEP_OVERHEAD_S = 3.9e-3
WORKER_FLOPS_PER_S = 15.1e9
RUN_FIXED_S = 36.0
CPU_WORKERS = 2


def estimate_wall_s(rungs: list[Rung], workers: int = CPU_WORKERS) -> float:
    """Expected wall seconds to train `rungs` on `workers` workers of the project's 2-core CPU."""
    core_s = sum(r.steps * (STEP_OVERHEAD_S + r.flops / r.steps / WORKER_FLOPS_PER_S) + RUN_FIXED_S for r in rungs)
    return core_s / workers


@dataclass(frozen=True)
class CheckRun:
    run_id: str
    kind: str  # "width", "horizon" or "batch"
    point: str  # "d{d}@{tokens:.3g}"
    d_model: int
    tokens: float
    lr_multiplier: float  # a prior's: its LR / the recipe's at this point
    batch_multiplier: float
    seed: int
    source: str = ""  # "" = trained in this check; else the --prior directory it lives in (as given)


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
    check = _check(spec)
    compute = max(check.hero_computes)
    return plan_hero(spec, expected_optimum(spec, compute), compute, depths=expected_depths(spec))


def _check(spec: LadderSpec) -> RecipeCheckSpec:
    if spec.recipe is None:
        raise DelphiError("recipe: the ladder spec has no recipe section; a recipe check checks a recipe")
    if spec.recipe.check is None:
        raise DelphiError("recipe.check: missing; give widths, width_tokens, horizons, horizon_width and hero_computes")
    return spec.recipe.check


def check_reach(spec: LadderSpec, rungs: list[Rung], hero: Rung) -> None:
    """DelphiError naming the key when the check's points do not span the smallest rung to the hero."""
    c = _check(spec)
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
    from delphi.train.config import train_config_to_dict

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


def _check_subject(spec: LadderSpec) -> dict:
    """The spec as data without its placement (PLACEMENT_KEYS) and its recipe's check: what an
    existing check directory must share with the spec that extends it."""
    from delphi.ladder.spec import ladder_spec_to_dict

    data = ladder_spec_to_dict(spec)
    for key in PLACEMENT_KEYS:
        data.pop(key, None)
    if isinstance(data.get("recipe"), dict):
        data["recipe"] = {k: v for k, v in data["recipe"].items() if k != "check"}
    return data


def _outside_constants(spec: LadderSpec) -> dict:
    """`_check_subject` without the name and the recipe's constants: what a prior check must share
    with this one (its runs' configs decide the rest, run by run)."""
    data = _check_subject(spec)
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
    from delphi.ladder.plan import SPEC_FILE, read_manifest
    from delphi.ladder.spec import load_ladder_spec
    from delphi.train.config import load_train_config, train_config_to_dict
    from delphi.train.rundir import read_status

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
    c = _check(spec)
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
    c = _check(spec)
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
    from delphi.io import atomic_write_yaml
    from delphi.ladder.plan import (
        CONFIG_DIR,
        MANIFEST_FILE,
        SPEC_FILE,
        manifest_csv,
        manifest_row,
        read_manifest,
        write_ladder,
    )
    from delphi.ladder.spec import ladder_spec_to_dict, load_ladder_spec
    from delphi.train.config import train_config_to_dict

    prior_runs = load_priors(spec, priors, out)
    rungs, runs = plan_check(spec, prior_runs)
    summary = check_summary(spec, rungs, runs, prior_runs)
    out = Path(out)
    if not (out / MANIFEST_FILE).is_file():
        write_ladder(spec, rungs, out)
    else:
        if _check_subject(load_ladder_spec(out / SPEC_FILE)) != _check_subject(spec):
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


# ---- analysis ------------------------------------------------------------------------------------


def _grid_step_log2(grid: Sequence[float]) -> float:
    """The median step of a multiplier grid in log2 (1 on the default factor-2 grids)."""
    import numpy as np

    logs = sorted({math.log2(m) for m in grid})
    return float(np.median(np.diff(logs))) if len(logs) >= 2 else 1.0


def _sweep(
    xs: list[float], losses: list[float], at: float, window_log2: float, own: list[bool] | None = None
) -> dict[str, Any]:
    """Quadratic in log2 x through every x within `window_log2` of the best finite x (seed means):
    the optimum, and the loss at `at` above it, from the runs flagged `own` (default: all)."""
    import numpy as np

    from delphi.fits.lr_optimum import fit_quadratic

    own = own if own is not None else [True] * len(xs)
    finite = [(x, y) for x, y in zip(xs, losses) if math.isfinite(y)]
    out: dict[str, Any] = {
        "x": xs,
        "losses": losses,
        "x_opt": None,
        "interior": False,
        "loss_opt": None,
        "loss_at_recipe": None,
        "loss_at_recipe_fit": None,
        "loss_opt_fit": None,
        "lost_frac": None,
        "lost_observed_frac": None,
        "lost_basis": None,
        "curvature": None,
        "best_x": None,
    }
    at_loss = [y for x, y, mine in zip(xs, losses, own) if mine and x == at and math.isfinite(y)]
    if at_loss:
        out["loss_at_recipe"] = float(np.mean(at_loss))
    if not finite:
        return out
    best_x, best_y = min(finite, key=lambda xy: xy[1])
    out["best_x"] = best_x
    loss_opt = best_y
    if len({x for x, _ in finite}) >= 3:
        # one loss per x (the seed mean) for the fit
        grouped: dict[float, list[float]] = {}
        for x, y in finite:
            grouped.setdefault(x, []).append(y)
        means = {x: float(np.mean(ys)) for x, ys in grouped.items()}
        centre = min(means, key=lambda x: means[x])
        gx = sorted(x for x in means if abs(math.log2(x / centre)) <= window_log2 + SAME_LR_REL)
        fit = fit_quadratic(np.array(gx), np.array([means[x] for x in gx]), len(gx))
        if fit.lr_opt is not None and fit.loss_opt is not None and fit.coef is not None:
            out.update(x_opt=fit.lr_opt, interior=bool(fit.interior), curvature=fit.coef[2])
            if fit.interior:
                loss_opt = min(loss_opt, fit.loss_opt)
                if gx[0] <= at <= gx[-1]:
                    a, b, c = fit.coef
                    out["loss_at_recipe_fit"] = a + b * math.log2(at) + c * math.log2(at) ** 2
                    out["loss_opt_fit"] = fit.loss_opt
    out["loss_opt"] = float(loss_opt)
    if out["loss_at_recipe"] is not None:
        out["lost_observed_frac"] = out["loss_at_recipe"] / loss_opt - 1
    # The gate's measure: the fitted curve at the recipe's value against its own minimum, so that
    # both sides carry the same seed noise; without an interior fit around the recipe's value, the
    # observed seed mean against the best run (a lower bound at the grid's edge).
    if out["loss_at_recipe_fit"] is not None:
        out.update(lost_frac=out["loss_at_recipe_fit"] / out["loss_opt_fit"] - 1, lost_basis="curve")
    elif out["lost_observed_frac"] is not None:
        out.update(lost_frac=out["lost_observed_frac"], lost_basis="observed")
    return out


def _trend(xs: list[float], ys: list[float | None], at: float) -> float | None:
    """Least-squares line of ys on log xs, evaluated at log `at` (None with < 2 distinct points)."""
    import numpy as np

    pairs = [(math.log(x), y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
    if len({p[0] for p in pairs}) < 2:
        return None
    slope, intercept = np.polyfit([p[0] for p in pairs], [p[1] for p in pairs], 1)
    return float(intercept + slope * math.log(at))


def analyse(spec: LadderSpec, out: str | Path) -> dict[str, Any]:
    """The report of the check planned in `out` (its plan file and the runs' summaries)."""
    import numpy as np

    from delphi.io import read_json

    out = Path(out)
    plan = read_json(out / PLAN_FILE, what="recipe-check plan")
    runs = [CheckRun(**r) for r in plan["check_runs"]]
    # a prior's run lives in its --prior directory (as given: relative to the working directory)
    loss = {
        (r.source, r.run_id): completed_val_loss((Path(r.source) if r.source else out) / RUNS_DIR / r.run_id)
        for r in runs
    }
    c = _check(spec)
    assert spec.recipe is not None
    lr_window = LR_FIT_NEIGHBOURS * _grid_step_log2(c.lr_multipliers)
    batch_window = BATCH_FIT_NEIGHBOURS * _grid_step_log2([1.0, *c.batch_multipliers])

    def key(r: CheckRun) -> tuple[str, str]:
        return r.source, r.run_id

    points = []
    for kind in ("width", "horizon"):
        by_point: dict[str, list[CheckRun]] = {}
        for r in runs:
            if r.kind == kind:
                by_point.setdefault(r.point, []).append(r)
        for name, rs in sorted(by_point.items(), key=lambda kv: (kv[1][0].d_model, kv[1][0].tokens)):
            xs = [r.lr_multiplier for r in rs]
            # the recipe's value (the gate's) is judged on this check's own seeds only
            sweep = _sweep(xs, [loss[key(r)] for r in rs], 1.0, lr_window, [not r.source for r in rs])
            seeds = [loss[key(r)] for r in rs if r.lr_multiplier == 1.0 and not r.source]
            finite_seeds = [s for s in seeds if math.isfinite(s)]
            points.append(
                {
                    "kind": kind,
                    "point": name,
                    "d_model": rs[0].d_model,
                    "tokens": rs[0].tokens,
                    "swept": "lr",
                    "m_opt": sweep["x_opt"],
                    **sweep,
                    "seed_sd": float(np.std(finite_seeds, ddof=1)) if len(finite_seeds) >= 2 else None,
                    "runs": len(rs),
                    "prior_runs": sum(bool(r.source) for r in rs),
                    "completed": sum(math.isfinite(loss[key(r)]) for r in rs),
                }
            )
    # batch sweeps: the batch runs plus the point's own seed-0 run at the recipe's batch and LR
    batch_points = sorted({r.point for r in runs if r.kind == "batch"})
    for name in batch_points:
        rs = [
            r
            for r in runs
            if r.point == name
            and (r.kind == "batch" or (not r.source and r.lr_multiplier == 1.0 and r.seed == c.seeds[0]))
        ]
        rs = list({key(r): r for r in rs}.values())
        sweep = _sweep(
            [r.batch_multiplier for r in rs], [loss[key(r)] for r in rs], 1.0, batch_window, [not r.source for r in rs]
        )
        points.append(
            {
                "kind": "batch",
                "point": name,
                "d_model": rs[0].d_model,
                "tokens": rs[0].tokens,
                "swept": "batch",
                "m_opt": None,
                **sweep,
                "seed_sd": None,
                "runs": len(rs),
                "prior_runs": sum(bool(r.source) for r in rs),
                "completed": sum(math.isfinite(loss[key(r)]) for r in rs),
            }
        )
    hero = plan["hero"]
    width_pts = [p for p in points if p["kind"] == "width"]
    horizon_pts = [p for p in points if p["kind"] == "horizon"]
    trend_width = _trend([p["d_model"] for p in width_pts], [p["lost_frac"] for p in width_pts], hero["d_model"])
    trend_horizon = _trend([p["tokens"] for p in horizon_pts], [p["lost_frac"] for p in horizon_pts], hero["tokens"])
    carried = max([t for t in (trend_width, trend_horizon) if t is not None], default=None)
    drift = _drift([p for p in points if p["swept"] == "lr"], c.horizon_width, spec.recipe.ref_tokens.value)
    r = spec.recipe
    suggested = None
    if drift["a"] is not None:
        # m* is the optimum in units of the recipe's LR, so each fitted slope adds to its exponent
        # (the horizon's with a minus sign: the recipe's horizon factor is (T0/T)^p).
        # The drift's width slope is about d_ref = horizon_width; moved to the recipe's own d0.
        width_slope = drift["b"] or 0.0
        suggested = {
            "lr": r.lr.value * math.exp(drift["a"]) * (r.ref_d_model.value / c.horizon_width) ** width_slope,
            "horizon_exponent": r.horizon_exponent.value - (drift["c"] or 0.0),
            "width_exponent": r.width_exponent.value + width_slope,
        }
    lost = [p["lost_frac"] for p in points if p["lost_frac"] is not None]
    return {
        "spec": spec.name,
        "optimizer": r.optimizer,
        "recipe_now": {
            "lr": r.lr.value,
            "horizon_exponent": r.horizon_exponent.value,
            "width_exponent": r.width_exponent.value,
            "ref_d_model": r.ref_d_model.value,
            "adam_lr": r.adam_lr.value,
            "ref_batch_tokens": r.ref_batch_tokens.value,
            "ref_tokens": r.ref_tokens.value,
        },
        "hero": hero,
        "reach": {"widest": max(c.widths), "longest": max(c.horizons)},
        "points": points,
        "worst_lost_frac": max(lost) if lost else None,
        "trend": {"width_at_hero": trend_width, "horizon_at_hero": trend_horizon, "carried_lost_frac": carried},
        "drift": drift,
        "recipe_suggested": suggested,
        "max_lost_frac": MAX_LOST_FRAC,
        "compute": {
            k: plan[k] for k in ("check_flops", "ladder_flops", "study_flops", "compute_ratio", "max_compute_ratio")
        },
        "priors": plan.get("priors", []),  # per --prior directory: runs reused, their FLOPs
        "complete": all(p["completed"] == p["runs"] for p in points),
    }


def _drift(points: list[dict], d_ref: int, t_ref: float) -> dict[str, float | None]:
    """log m* = a + b log(d / d_ref) + c log(T / t_ref) over the interior optima (`fit_lr_drift`)."""
    from delphi.fits.lr_optimum import fit_lr_drift

    ok = [p for p in points if p["m_opt"] is not None and p["interior"]]
    fitted = (
        fit_lr_drift([p["m_opt"] for p in ok], [p["d_model"] / d_ref for p in ok], [p["tokens"] / t_ref for p in ok])
        if ok
        else None
    )
    a, b, c = fitted if fitted is not None else (None, None, None)
    return {"a": a, "b": b, "c": c, "points": float(len(ok))}


RUNS_CSV = "recipe_check_runs.csv"
RUNS_CSV_COLUMNS = (
    "run_id",
    "kind",
    "point",
    "d_model",
    "n_layers",
    "tokens",
    "steps",
    "batch_size",
    "lr_multiplier",
    "batch_multiplier",
    "seed",
    "optimizer",
    "lr",
    "adam_lr",
    "beta2",
    "eps",
    "val_loss",
    "source",
)


def runs_csv(out: str | Path) -> str:
    """One row per (run, role) of the check in `out`: what it trained with and its final loss (the
    compact record a check commits; `analyse` recomputes the report from it and the plan)."""
    import csv
    import io

    from delphi.io import read_json
    from delphi.ladder.plan import read_manifest

    out = Path(out)
    plan = read_json(out / PLAN_FILE, what="recipe-check plan")
    manifests: dict[str, dict[str, dict[str, str]]] = {}
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=RUNS_CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in plan["check_runs"]:
        source = r.get("source", "")
        home = Path(source) if source else out
        if source not in manifests:
            manifests[source] = {row["run_id"]: row for row in read_manifest(home)}
        m = manifests[source][r["run_id"]]
        loss = completed_val_loss(home / RUNS_DIR / r["run_id"])
        writer.writerow(
            {
                **{
                    k: r[k]
                    for k in (
                        "run_id",
                        "kind",
                        "point",
                        "d_model",
                        "tokens",
                        "lr_multiplier",
                        "batch_multiplier",
                        "seed",
                    )
                },
                **{
                    k: m.get(k, "")
                    for k in ("n_layers", "steps", "batch_size", "optimizer", "lr", "adam_lr", "beta2", "eps")
                },
                "val_loss": repr(loss) if math.isfinite(loss) else "",
                "source": source,
            }
        )
    return buf.getvalue()


def save_report(report: dict[str, Any], out: str | Path) -> Path:
    """Write the report (JSON) and the runs' table (CSV) into `out`; the JSON's path."""
    path = Path(out) / REPORT_FILE
    atomic_write_text(path, json.dumps(report, indent=2) + "\n")
    atomic_write_text(Path(out) / RUNS_CSV, runs_csv(out))
    return path


def _pct(x: float | None) -> str:
    return f"{x:+.2%}" if x is not None else "-"


def format_report(report: dict[str, Any]) -> str:
    def loss(x: float | None) -> str:
        return f"{x:.4f}" if x is not None else "-"

    lines = [
        f"recipe check of {report['spec']} ({report['optimizer']}): loss lost to the recipe's LR / batch, "
        f"the fitted curve at the recipe's value over its minimum (limit {report['max_lost_frac']:.1%}); "
        f"observed: the recipe's seed mean over the best, seed noise included",
        f"{'kind':<8} {'point':<14} {'swept':<6} {'optimum':>8} {'mean@1':>7} {'curve@1':>7} {'curve min':>9} "
        f"{'lost':>7} {'observed':>8} {'seed sd':>7} {'runs':>5}",
    ]
    for p in report["points"]:
        if p["x_opt"] is not None and p["interior"]:
            opt = f"{p['x_opt']:.2f}x"
        else:  # no interior optimum: the best point tried (at the grid's edge, the loss lost is a lower bound)
            opt = f"best {p['best_x']:g}x" if p["best_x"] is not None else "-"
        sd = f"{p['seed_sd']:.4f}" if p["seed_sd"] is not None else "-"
        prior = f" ({p['prior_runs']} prior)" if p.get("prior_runs") else ""
        lines.append(
            f"{p['kind']:<8} {p['point']:<14} {p['swept']:<6} {opt:>8} {loss(p['loss_at_recipe']):>7} "
            f"{loss(p.get('loss_at_recipe_fit')):>7} {loss(p.get('loss_opt_fit') or p['loss_opt']):>9} "
            f"{_pct(p['lost_frac']):>7} {_pct(p.get('lost_observed_frac')):>8} {sd:>7} "
            f"{p['completed']:>2}/{p['runs']:<2}{prior}"
        )
    t, h = report["trend"], report["hero"]
    lines.append(
        f"trend carried to the hero {h['run_id']} (d{h['d_model']}, {h['tokens']:.3g} tokens): width "
        f"{_pct(t['width_at_hero'])}, horizon {_pct(t['horizon_at_hero'])}"
    )
    d = report["drift"]
    if d["a"] is not None:
        lines.append(
            f"LR optimum drift: log m* = {d['a']:+.3f}"
            + (f" {d['b']:+.3f} log(d/d_ref)" if d["b"] is not None else "")
            + (f" {d['c']:+.3f} log(T/T0)" if d["c"] is not None else "")
        )
    if report.get("recipe_suggested"):
        s = report["recipe_suggested"]
        now = report["recipe_now"]
        lines.append(
            f"recipe now: lr {now['lr']:.4g}, horizon_exponent {now['horizon_exponent']:.3f}, width_exponent "
            f"{now.get('width_exponent', 0.0):.3f}; fitted: lr {s['lr']:.4g}, horizon_exponent "
            f"{s['horizon_exponent']:.3f}, width_exponent {s.get('width_exponent', 0.0):.3f}"
        )
    for prior in report.get("priors") or []:
        lines.append(f"reused from --prior {prior['dir']}: {prior['runs']} runs, {prior['flops']:.3g} FLOPs")
    cm = report["compute"]
    lines.append(
        f"compute: check {cm['check_flops']:.3g} FLOPs = {cm['compute_ratio']:.1%} of the study's {cm['study_flops']:.3g} "
        f"(limit {cm['max_compute_ratio']:.0%})"
    )
    return "\n".join(lines)


# ---- gate `recipe` -------------------------------------------------------------------------------


def gate_problems(
    report: dict[str, Any], hero: dict[str, float] | None = None, limit: float = MAX_LOST_FRAC
) -> tuple[list[str], list[str], float | None]:
    """(problems, parts, worst) of a recipe-check report: a point losing more than `limit`, a carried
    trend above it, a point without a result, or a hero (hero_facts) wider or longer than the check reached."""
    problems, parts = [], []
    points = report.get("points") or []
    if not points:
        return ["the recipe check has no points"], [], None
    for p in points:
        where = f"{p['kind']} {p['point']}"
        if p.get("lost_frac") is None:
            problems.append(
                f"{where}: no loss at the recipe's value or no optimum ({p.get('completed', 0)}/{p.get('runs', 0)} runs)"
            )
            continue
        parts.append(f"{where} {p['lost_frac']:+.2%}")
        if p["lost_frac"] > limit:
            problems.append(
                f"{where}: the recipe loses {p['lost_frac']:.2%} against the sweep's optimum "
                f"({p.get('lost_basis') or 'observed'}; > {limit:.2%})"
            )
    carried = (report.get("trend") or {}).get("carried_lost_frac")
    if carried is not None and carried > limit:
        problems.append(f"the trend with width or horizon carries {carried:.2%} to the hero (> {limit:.2%})")
    reach = report.get("reach") or {}
    if hero and reach:
        if "d_model" in hero and hero["d_model"] > reach["widest"]:
            problems.append(
                f"hero d_model {hero['d_model']:.0f} wider than the check's widest point d{reach['widest']}"
            )
        if "tokens" in hero and hero["tokens"] > reach["longest"] * (1 + REACH_SLACK_REL):
            problems.append(
                f"hero trains {hero['tokens']:.3g} tokens, past the check's longest horizon {reach['longest']:.3g}"
            )
    lost = [p["lost_frac"] for p in points if p.get("lost_frac") is not None]
    worst = max([*lost, *([carried] if carried is not None else [])], default=None)
    return problems, parts, worst


def read_report(path: "Path | None") -> dict[str, Any] | None:
    """A recipe-check report (gate recipe's evidence); None for no path."""
    if path is None:
        return None
    from delphi.io import read_json

    report = read_json(path, what="recipe-check JSON")
    if not isinstance(report, dict) or not isinstance(report.get("points"), list):
        raise DelphiError(f"{path}: not a `delphi ladder recipe-check` report (expected a 'points' list)")
    return report


def study_report_path(study_path: "str | Path | None", value: str | None) -> Path | None:
    """gates.recipe_check of a study file, resolved against it; DelphiError when it is missing."""
    if value is None:
        return None
    if study_path is None:
        raise DelphiError("gates.recipe_check: needs a study file to resolve the report against")
    path = (Path(study_path).parent / value).resolve()
    if not path.is_file():
        raise DelphiError(
            f"{study_path}: gates.recipe_check: {path} not found (write it with `delphi ladder recipe-check`)"
        )
    return path
