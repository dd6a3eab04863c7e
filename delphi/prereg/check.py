"""Compare a (possibly still training) run with its preregistration.

Verdicts and exit codes (docs/design.md §3.1: 0 ok, 1 the checked thing failed):

    not-started  no eval point yet                                   exit 0
    in-progress  evals, none the seal can judge yet: before its      exit 0
                 trajectory starts, or a seal of the final loss only
    on-track     latest eval point inside the 90% band or within     exit 0
                 the tolerance of the trajectory's median
    deviating    latest eval point outside both                      exit 1
    passed       run completed, final val_loss within tolerance      exit 0
    failed       run completed outside tolerance, or diverged/failed exit 1
    invalid: the run predates the preregistration                    exit 1
                 its first step was logged before the seal was made
    invalid: the run's start cannot be established                  exit 1
                 it ran, but its log does not say when
    (a broken seal is CheckFailed: exit 1, nothing compared)

The run is a Delphi run dir, another trainer's metrics log or a directory holding one
(`delphi.train.runlog`), or a W&B run. A Delphi run has ended when its status.json says so; a log
when an eval reaches the hero's tokens or steps (`read_hero_run`), its final loss that eval's.

Only a final verdict (passed or failed) writes NAME.outcome.json, and only for the run it scored:
an outcome is bound to that run (its first step's time and its config's sha256), and checking
another run reports that run's verdict without replacing it. An invalid verdict writes nothing.
An outcome is written once: checking its run again leaves it unchanged, and a verdict or number
that disagrees with it (the run's records edited since) is exit 1 naming both.

A run stopped before its end (a signal, to be resumed) gets no final verdict and
no outcome file: it is checked as a run in progress (status "stopped").

Deviating exits 1 so that a monitor alarms; with --watch only the final verdict
sets the exit code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from delphi import prereg_format as fmt
from delphi.config_schema import to_dict
from delphi.errors import CheckFailed, DelphiError
from delphi.fits.shape_trajectory import project_finals
from delphi.hashes import sha256_file
from delphi.io import atomic_write_json, read_yaml
from delphi.prereg.competing import score_competing
from delphi.prereg.create import parse_utc, utc_now
from delphi.train.config import train_config_from_dict
from delphi.train.rundir import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    STATUS_FILE,
    SUMMARY_FILE,
    read_json_object,
    stale_running,
)
from delphi.train.runlog import (
    TIME_ALIASES,
    ColumnNotFound,
    LogOptions,
    RunEnd,
    RunState,
    is_delphi_run_dir,
    read_to_end,
    read_wandb,
)
from delphi.train.verdict import FINAL_VERDICTS, compare, judged

PREDATES = "invalid: the run predates the preregistration"
START_UNKNOWN = "invalid: the run's start cannot be established"
SEAL_BROKEN = "invalid: the seal is broken"
EXIT = {
    "not-started": 0,
    "in-progress": 0,
    "on-track": 0,
    "passed": 0,
    "deviating": 1,
    "failed": 1,
    PREDATES: 1,
    START_UNKNOWN: 1,
    SEAL_BROKEN: 1,
}
OUTCOME_COMMAND = "prereg check"  # the outcome file's output-policy marker (delphi.written_by)


def exit_code(verdict: str) -> int:
    return EXIT[verdict]


def with_projection(result: dict[str, Any], prereg: fmt.Prereg, shape_run: Path) -> dict[str, Any]:
    """`result` plus, at every eval point, the final loss the run is heading for on `shape_run`'s
    curve (`delphi.fits.shape_trajectory.project_finals`) against the sealed final: an early warning, not a verdict."""
    if not isinstance(prereg.doc["hero"].get("config"), dict):
        raise DelphiError(
            f"--shape: {prereg.path}'s hero is given as N and D, with no schedule to project its evals along"
        )
    hero = train_config_from_dict(prereg.doc["hero"]["config"])
    projected = project_finals(result["points"], shape_run, hero)
    for p in projected:
        p["vs_predicted"] = p["projected_final"] / float(prereg.final["loss"]) - 1
    return result | {"projection": {"shape_run": str(shape_run), "points": projected}}


def run_identity(run: RunState, run_dir: Path | None) -> dict[str, Any]:
    """What binds an outcome to the run it scored: where it was, when its first step was logged
    and the sha256 of its config.yaml (the last two survive a move of the run dir)."""
    identity: dict[str, Any] = {"run": run.source, "run_first_step_time": run.first_step_time}
    if run_dir is not None:
        identity["run_dir"] = str(Path(run_dir).resolve())
        config = Path(run_dir) / CONFIG_FILE
        identity["run_config_sha256"] = sha256_file(config) if config.is_file() else None
    return identity


def same_run(outcome: dict, identity: dict[str, Any]) -> bool:
    """Whether an existing outcome scored the run `identity` describes. An outcome with no first-step
    time recorded names its run by path only."""
    if outcome.get("run_first_step_time") is not None:
        return outcome.get("run_first_step_time") == identity.get("run_first_step_time") and outcome.get(
            "run_config_sha256"
        ) == identity.get("run_config_sha256")
    recorded = outcome.get("run")
    if not isinstance(recorded, str):
        return False
    if recorded == identity["run"]:
        return True
    here = identity.get("run_dir")
    try:
        return here is not None and Path(recorded).resolve() == Path(here)
    except OSError:
        return False


def read_outcome(prereg_path: Path) -> dict | None:
    """NAME.outcome.json as a dict; None when there is none; {} when it is not an outcome (a file
    someone else put there, which nothing replaces)."""
    path = fmt.outcome_path(prereg_path)
    if not path.exists():
        return None
    return read_json_object(path)


def record_outcome(prereg_path: Path, result: dict, identity: dict[str, Any] | None = None) -> Path | None:
    """Write NAME.outcome.json beside the preregistration (outside the sealed file), bound to the
    run it scored; None (and nothing written) when an outcome of another run is already there.

    An outcome is written once: the same run checked again leaves it as it is, and a check whose
    verdict or numbers disagree with it (the run's records changed since) is CheckFailed naming both."""
    out = fmt.outcome_path(prereg_path)
    identity = identity or {"run": result.get("run")}
    existing = read_outcome(prereg_path)
    if existing is not None and not same_run(existing, identity):
        return None
    if existing and existing.get("verdict") in FINAL_VERDICTS:
        differ = {
            k: {"recorded": existing.get(k), "now": result.get(k)}
            for k in OUTCOME_FIELDS
            if k in existing and numbers_differ(existing.get(k), result.get(k))
        }
        if differ:
            shown = "; ".join(f"{k}: recorded {v['recorded']!r}, now {v['now']!r}" for k, v in differ.items())
            raise CheckFailed(
                f"{out}: the outcome recorded at {existing.get('checked', '?')} says {existing.get('verdict')}, but this "
                f"check of the same run says {result.get('verdict')} ({shown}): the run's records changed after its "
                "outcome was written; an outcome is written once and is not replaced",
                result={k: v for k, v in result.items() if k != "points"}
                | {"outcome_file": str(out), "outcome_conflict": differ},
            )
        return out
    keep = {k: v for k, v in result.items() if k != "points"}
    atomic_write_json(
        out, keep | identity | {"checked": utc_now(), "points": result["points"]}, written_by=OUTCOME_COMMAND
    )
    return out


def _mark_forced(result: dict, doc: dict) -> None:
    """A preregistration sealed with --force over failing gates says so in every verdict."""
    result["forced"] = bool(doc.get("forced", False))
    if result["forced"]:
        failed = [g.get("name") for g in doc.get("gates") or [] if not g.get("passed") and g.get("applicable", True)]
        result["why"] = f"{result.get('why', '')} [SEALED WITH --force; failed gates: {', '.join(failed) or '?'}]"


def ran_evidence(run_dir: Path, n_rows: int) -> str | None:
    """Why a run dir whose first step has no time is known to have run (None: it has not started).

    metrics.jsonl (`n_rows` rows) is the only record of when the first step happened; if it is
    missing, empty or has no timestamps while status.json, summary.json or checkpoints show steps
    were taken, the run's start is unknown, not "after the preregistration"."""
    run_dir = Path(run_dir)
    metrics = run_dir / METRICS_FILE
    lost = (
        f"{metrics.name} has {n_rows} rows without a time"
        if n_rows
        else f"{metrics.name} is {'empty' if metrics.is_file() else 'missing'}"
    )
    status = read_json_object(run_dir / STATUS_FILE)
    if status.get("status") not in (None, "pending") or (status.get("step") or 0) > 0:
        return f"{lost} but status.json says {status.get('status')!r} at step {status.get('step')}"
    if (run_dir / SUMMARY_FILE).is_file():
        return f"{lost} but summary.json exists"
    checkpoints = run_dir / CHECKPOINTS_DIR
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        return f"{lost} but {CHECKPOINTS_DIR}/ holds checkpoints"
    return lost if n_rows else None


def hero_mismatch(doc: dict, prereg_path: Path, run_dir: Path, seed: int | None = None) -> str | None:
    """Why the run in `run_dir` is not the preregistered hero (None: its config is the hero's).

    Compared: the run's config.yaml against the hero config sealed in the preregistration,
    both normalised through the config schema (defaults filled) and without `mesh`, which
    does not change the maths (the trainer's own config identity). With `seed` (one seed of a
    multi-seed seal) the hero config with seed and data.seed set to it, the run's name aside."""
    sealed = (doc.get("hero") or {}).get("config")
    if not isinstance(sealed, dict):
        return None  # a preregistration without the hero's config: nothing to compare
    config_path = Path(run_dir) / CONFIG_FILE
    if not config_path.is_file():
        return None  # not started yet (a watch may begin before the trainer writes its config)
    data = read_yaml(config_path)
    if not isinstance(data, dict):
        raise DelphiError(f"{config_path}: expected a train config mapping, got {type(data).__name__}")
    try:
        run_cfg = to_dict(train_config_from_dict(data, str(config_path)))
        hero_cfg = to_dict(train_config_from_dict(sealed, f"{prereg_path}: hero.config"))
    except DelphiError as e:
        raise DelphiError(f"cannot compare the run with the hero: {e}") from None
    run_cfg.pop("mesh", None)
    hero_cfg.pop("mesh", None)
    if seed is not None:
        hero_cfg |= {"seed": seed, "data": hero_cfg["data"] | {"seed": seed}}
        run_cfg.pop("name", None)
        hero_cfg.pop("name", None)
    differ = _differences(hero_cfg, run_cfg)
    if not differ:
        return None
    shown = ", ".join(f"{k}: hero {a!r} vs run {b!r}" for k, a, b in differ[:3])
    return f"its config.yaml differs from the preregistered hero's config ({shown}{', ...' if len(differ) > 3 else ''})"


def _differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in list(a) + [k for k in b if k not in a]:
            out += _differences(a.get(key), b.get(key), f"{path}.{key}" if path else str(key))
        return out
    return [] if a == b else [(path, a, b)]


def start_order(doc: dict, run: RunState, run_dir: Path | None) -> tuple[bool | None, str | None]:
    """Whether the preregistration was created before the run's first logged step: (True, None),
    (False, why) or (None, why) when the run ran but when it started is gone. A run with nothing
    logged yet has not started: the prediction precedes it. Another trainer's log must carry a time
    column: nothing else in it says when its first row was written."""
    evidence = None
    if run.first_step_time is None and run.kind == "log" and run.n_rows:
        evidence = (
            f"its {run.n_rows} rows have no time (looked for a column {', '.join(TIME_ALIASES)}; map one with "
            "--time-col: epoch seconds or ISO 8601 with a zone)"
        )
    elif run_dir is not None and run.first_step_time is None and run.kind == "run_dir":
        evidence = ran_evidence(run_dir, run.n_rows)
    if evidence:
        return None, (
            f"{run.path if run.kind == 'log' else run_dir}: cannot establish when the run started: {evidence}; "
            "the preregistration cannot be shown to precede it"
        )
    if run.first_step_time is None:
        return True, None
    if parse_utc(doc["created"]) <= run.first_step_time:
        return True, None
    return False, (
        f"created {doc['created']} after the run's first logged step "
        f"({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(run.first_step_time))})"
    )


def read_hero_run(doc: dict, run_path: Path | None, wandb_path: str | None, log: LogOptions = LogOptions()) -> RunState:
    """The hero's run: a Delphi run dir or a W&B run as they say, or another trainer's log, completed
    once an eval reaches the sealed hero's tokens or steps (`delphi.train.runlog.read_to_end`)."""
    if run_path is not None:
        return read_to_end(run_path, RunEnd.of_hero(doc.get("hero") or {}), log)
    if log.finished:
        raise DelphiError(f"--finished: --wandb {wandb_path} is a W&B run, whose state says when it ended")
    return read_wandb(wandb_path, log.columns)


def log_description(run: RunState) -> dict[str, Any]:
    """For another trainer's log: which file was read and which column gave each quantity."""
    return {"log": {"path": str(run.path), "columns": dict(run.columns)}} if run.kind == "log" else {}


def target_seeds(doc: dict) -> list[int] | None:
    """The seeds whose mean final loss a multi-seed seal predicts (its "target"); None: one run."""
    target = doc.get("target")
    return [int(s) for s in target["seeds"]] if isinstance(target, dict) and target.get("seeds") else None


def check(
    prereg_path: Path,
    *,
    run_dir: Path | None = None,
    wandb_path: str | None = None,
    record: bool = True,
    run_dirs: list[Path] | None = None,
    log: LogOptions = LogOptions(),
) -> tuple[dict, fmt.Prereg, RunState]:
    """Compare the run with the preregistration; a final verdict is recorded as NAME.outcome.json
    for the run it scored (module docstring), unless `record` is false (a reader of committed data,
    e.g. the paper, scores the run without writing beside the seal). A broken seal is CheckFailed
    (exit 1). A multi-seed seal (`target_seeds`) is checked on `run_dirs`, one per sealed seed
    (`check_seeds`); `run_dirs` of one is `run_dir`. A run dir may be another trainer's log (or a
    directory holding one), read by `log` (`read_hero_run`)."""
    prereg = fmt.load_prereg(prereg_path)
    seal = fmt.seal_status(prereg.doc)
    if not seal["ok"]:
        raise CheckFailed(
            f"{prereg_path}: {SEAL_BROKEN}: the seal does not match the content (edited after "
            "sealing); nothing compared, no outcome written (`delphi prereg verify` shows the digests)"
        )
    seeds = target_seeds(prereg.doc)
    if run_dirs is not None and len(run_dirs) == 1 and seeds is None:
        run_dir = run_dirs[0]
    elif run_dirs is not None or seeds is not None:
        return check_seeds(prereg_path, prereg, seeds, list(run_dirs or ([run_dir] if run_dir else [])), record, log)
    if run_dir is not None and (mismatch := hero_mismatch(prereg.doc, prereg_path, run_dir)):
        raise DelphiError(f"--run {run_dir}: not the preregistered hero of {prereg_path}: {mismatch}")
    run = read_hero_run(prereg.doc, run_dir, wandb_path, log)
    result = compare(prereg, run) | log_description(run)
    result["seal_ok"] = seal["ok"]
    order, problem = start_order(prereg.doc, run, run_dir)
    result["created_before_start"] = order
    if order is not True:
        result |= {"verdict": PREDATES if order is False else START_UNKNOWN, "why": problem}
    _mark_forced(result, prereg.doc)
    if record and result["verdict"] in FINAL_VERDICTS:
        identity = run_identity(run, run_dir)
        written = record_outcome(prereg_path, result, identity)
        result["outcome_file"] = None if written is None else str(written)
        if written is None:
            other = (read_outcome(prereg_path) or {}).get("run")
            result["outcome_kept"] = (
                f"{fmt.outcome_path(prereg_path)} scores another run ({other or 'not an outcome'}); "
                "an outcome is bound to the run it scored and is not replaced"
            )
    return result, prereg, run


def check_seeds(
    prereg_path: Path,
    prereg: fmt.Prereg,
    seeds: list[int] | None,
    run_dirs: list[Path],
    record: bool,
    log: LogOptions = LogOptions(),
) -> tuple[dict, fmt.Prereg, RunState]:
    """A multi-seed seal against its runs, one per sealed seed: each seed's curve against the band,
    and the verdict on the mean of their final losses (the sealed quantity). A seed whose first step
    came before the seal makes the outcome invalid; any seed diverged or failed fails it; while any
    trains, the verdict is the worst seed's (deviating over on-track over in-progress over not-started).
    The RunState returned is the first seed's (for a figure's axes); every seed's curve is in
    result["seeds"]. Delphi run dirs say their seed (config.yaml); other trainers' logs, which do
    not, are the sealed seeds in the order given."""
    if seeds is None:
        raise DelphiError(f"--run: {prereg_path} seals one run; give one --run, not {len(run_dirs)}")
    if len({Path(r).resolve() for r in run_dirs}) != len(run_dirs):
        raise DelphiError(
            f"--run: the same run dir is given twice ({', '.join(str(r) for r in run_dirs)}); "
            f"{prereg_path} seals the mean of {len(seeds)} seeds' runs, one --run each"
        )
    if len(run_dirs) != len(seeds):
        raise DelphiError(
            f"--run: {prereg_path} seals the mean of seeds {', '.join(map(str, seeds))}: give one --run per "
            f"seed ({len(seeds)}), got {len(run_dirs)}"
        )
    by_seed: dict[int, Path] = {}
    for run_dir in run_dirs:
        if not Path(run_dir).exists():
            raise DelphiError(f"{run_dir}: run dir not found")
    delphi_dirs = [is_delphi_run_dir(Path(r)) for r in run_dirs]
    if not any(delphi_dirs):
        by_seed = dict(zip(seeds, map(Path, run_dirs)))
    elif not all(delphi_dirs):
        raise DelphiError(
            f"--run: {', '.join(str(r) for r, d in zip(run_dirs, delphi_dirs) if not d)} is another "
            "trainer's log and the others Delphi run dirs; give the seeds' runs in one form"
        )
    for run_dir in run_dirs if all(delphi_dirs) else []:
        seed = run_seed(Path(run_dir))
        if seed not in seeds:
            raise DelphiError(f"--run {run_dir}: its seed {seed} is not one of the sealed seeds {seeds}")
        if mismatch := hero_mismatch(prereg.doc, prereg_path, Path(run_dir), seed):
            raise DelphiError(
                f"--run {run_dir}: not seed {seed} of the preregistered hero of {prereg_path}: {mismatch}"
            )
        if seed in by_seed:
            raise DelphiError(
                f"--run {run_dir}: seed {seed} again ({by_seed[seed]} is seed {seed} too); "
                f"give one run per sealed seed {seeds}"
            )
        by_seed[seed] = Path(run_dir)
    runs = {seed: read_hero_run(prereg.doc, by_seed[seed], None, log) for seed in seeds}
    per_seed = []
    for seed, run in runs.items():
        one = compare(prereg, run) | log_description(run)
        order, problem = start_order(prereg.doc, run, by_seed[seed])
        one |= {"seed": seed, "created_before_start": order}
        if order is not True:
            one |= {"verdict": PREDATES if order is False else START_UNKNOWN, "why": problem}
        per_seed.append(one)
    final_pred = prereg.final
    tol = prereg.tolerance_rel
    result: dict[str, Any] = {
        "prereg": prereg.id,
        "seal": prereg.doc.get("seal", {}).get("digest"),
        "seal_ok": True,
        "run": ", ".join(r.source for r in runs.values()),
        "target_seeds": seeds,
        "tolerance_rel": tol,
        "predicted_final_loss": final_pred["loss"],
        "n_points": sum(o["n_points"] for o in per_seed),
        "n_outside_90": sum(o["n_outside_90"] for o in per_seed),
        "points": [p | {"seed": o["seed"]} for o in per_seed for p in o["points"]],
        "seeds": [{k: v for k, v in o.items() if k != "points"} for o in per_seed],
        "created_before_start": all(o["created_before_start"] is True for o in per_seed),
    }
    statuses = [r.status for r in runs.values()]
    result["status"] = statuses[0] if len(set(statuses)) == 1 else ", ".join(statuses)
    invalid = [o for o in per_seed if o["verdict"] in (PREDATES, START_UNKNOWN)]
    broken = [o for o in per_seed if runs[o["seed"]].status in ("diverged", "failed")]
    if invalid:
        first = invalid[0]
        result |= {"verdict": first["verdict"], "why": f"seed {first['seed']}: {first['why']}"}
    elif broken:
        result |= {"verdict": "failed", "why": "; ".join(f"seed {o['seed']}: {o['why']}" for o in broken)}
    elif all(s == "completed" for s in statuses):
        finals = [o.get("actual_final_loss") for o in per_seed]
        if any(f is None for f in finals):
            result |= {"verdict": "failed", "why": "a seed completed without a final val_loss"}
        else:
            actual = sum(finals) / len(finals)
            rel = (actual - final_pred["loss"]) / final_pred["loss"]
            lo50, hi50 = final_pred.get("loss_50") or (None, None)
            lo90, hi90 = final_pred.get("loss_90") or (None, None)
            result |= {
                "verdict": "passed" if abs(rel) <= tol else "failed",
                "actual_final_loss": actual,
                "rel_error": rel,
                "covered_50": None if lo50 is None else bool(lo50 <= actual <= hi50),
                "covered_90": None if lo90 is None else bool(lo90 <= actual <= hi90),
                "why": (
                    f"mean final val_loss of seeds {', '.join(map(str, seeds))} {actual:.4f} "
                    f"({', '.join(f'{f:.4f}' for f in finals)}) vs predicted {final_pred['loss']:.4f}: {rel:+.2%} "
                    f"(tolerance {tol:.2%})"
                ),
            }
            if "competing" in prereg.doc.get("prediction", {}):
                result["competing"] = score_competing(prereg.doc["prediction"]["competing"], actual)
    else:
        order = ("deviating", "on-track", "in-progress", "not-started", "passed", "failed")
        worst = min(per_seed, key=lambda o: order.index(o["verdict"]) if o["verdict"] in order else len(order))
        verdict = worst["verdict"] if worst["verdict"] in order[:4] else "on-track"
        result |= {
            "verdict": verdict,
            "why": "; ".join(f"seed {o['seed']} [{o['status']}] {o['why']}" for o in per_seed),
        }
    if result["verdict"] not in FINAL_VERDICTS:
        result |= {
            "n_evals": sum(len(r.evals) for r in runs.values()),
            "judged": f"{judged(prereg, _slowest(runs.values()))}; the verdict on the mean of the {len(seeds)} seeds' final losses",
        }
    _mark_forced(result, prereg.doc)
    if record and result["verdict"] in FINAL_VERDICTS:
        identities = [run_identity(runs[s], by_seed[s]) for s in seeds]
        identity = {
            "run": result["run"],
            "run_first_step_time": min(i["run_first_step_time"] for i in identities),
            "run_config_sha256": "+".join(str(i.get("run_config_sha256")) for i in identities),
            "runs": identities,
        }
        written = record_outcome(prereg_path, result, identity)
        result["outcome_file"] = None if written is None else str(written)
        if written is None:
            result["outcome_kept"] = (
                f"{fmt.outcome_path(prereg_path)} scores other runs; an outcome is bound to the "
                "runs it scored and is not replaced"
            )
    return result, prereg, runs[seeds[0]]


def _slowest(runs: Any) -> float | None:
    """The latest eval's tokens of the run furthest behind (None while one has no eval with tokens)."""
    latest = [next((e.tokens for e in reversed(r.evals) if e.tokens is not None), None) for r in runs]
    return None if any(t is None for t in latest) else min(latest)


def run_seed(run_dir: Path) -> int:
    config = read_yaml(run_dir / CONFIG_FILE) if (run_dir / CONFIG_FILE).is_file() else None
    if not isinstance(config, dict) or not isinstance(config.get("seed"), int):
        raise DelphiError(f"--run {run_dir}: no config.yaml with a seed; has the run started?")
    return int(config["seed"])


def watch(
    prereg_path: Path,
    *,
    run_dir: Path | None,
    wandb_path: str | None,
    interval_s: float,
    timeout_s: float | None,
    on_update: Callable[[dict], None] | None = None,
    run_dirs: list[Path] | None = None,
    log: LogOptions = LogOptions(),
    on_wait: Callable[[str], None] | None = None,
) -> tuple[dict, fmt.Prereg, RunState]:
    """Poll until the verdict is final (passed or failed: a multi-seed seal's once every seed has ended,
    or one has failed) or invalid, the run is stopped to be resumed, or timeout_s passes. A JSON log
    whose rows have not yet brought a column it needs (the eval loss before the first eval) is waited
    for, said once through `on_wait`; still missing at timeout_s, it is the error."""
    start = time.monotonic()
    shown: tuple | None = None
    waiting: str | None = None
    while True:
        timed_out = timeout_s is not None and time.monotonic() - start > timeout_s
        try:
            result, prereg, run = check(prereg_path, run_dir=run_dir, wandb_path=wandb_path, run_dirs=run_dirs, log=log)
        except ColumnNotFound as missing:
            if not missing.sparse or timed_out:
                raise
            if on_wait is not None and str(missing) != waiting:
                on_wait(f"waiting: {missing}")
            waiting = str(missing)
            time.sleep(interval_s)
            continue
        key = (result["verdict"], result["n_points"], result.get("n_evals"))
        if on_update and key != shown:
            on_update(result)
            shown = key
        if result["verdict"] in (*FINAL_VERDICTS, PREDATES, START_UNKNOWN):
            return result, prereg, run
        seeds = result.get("seeds") or [{"run": run.source, "status": run.status}]
        if stopped := [
            s["run"] for s in seeds if s["status"] == "stopped"
        ]:  # never moves until resumed: no end to polling it
            result["watch"] = (
                f"stopped watching: {', '.join(stopped)} is stopped, to be resumed ({run.reason or 'a signal'}); "
                "resume it and watch again"
            )
            return result, prereg, run
        watched = [
            Path(d) for d in (run_dirs or ([run_dir] if run_dir is not None else [])) if is_delphi_run_dir(Path(d))
        ]
        if stale := [why for why in map(stale_running, watched) if why]:
            raise CheckFailed("; ".join(stale) + " (nothing trains it: resume it, or stop watching)")
        if timed_out:
            result["watch"] = f"stopped after {timeout_s:g} s without a final verdict"
            return result, prereg, run
        time.sleep(interval_s)


# What an outcome file states that its run's own records decide (recomputed by verify and index).
OUTCOME_FIELDS = ("actual_final_loss", "rel_error", "verdict", "covered_50", "covered_90")


def numbers_differ(a: Any, b: Any) -> bool:
    if (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return abs(float(a) - float(b)) > 1e-9 * max(abs(float(b)), 1.0)
    return a != b
