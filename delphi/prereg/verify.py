"""`delphi prereg verify`: everything a preregistration claims, checked against records it cannot
edit: its seal, the order of the seal and its runs' first steps, each fingerprinted input's sha256,
the outcome file (consistent with the sealed rule and recomputed from its runs' logs), and the git
commit that first added the seal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from delphi import prereg_format as fmt
from delphi.errors import CheckFailed, DelphiError
from delphi.first_commit import FirstCommit, first_commit
from delphi.hashes import sha256_file
from delphi.prereg.check import (
    OUTCOME_FIELDS,
    check,
    hero_mismatch,
    numbers_differ,
    read_outcome,
    run_seed,
    start_order,
    target_seeds,
)
from delphi.train.runlog import read_run_dir, read_wandb
from delphi.train.verdict import FINAL_VERDICTS

# provenance: (path key, sha256 key) of each fingerprinted input whose file the seal names.
FINGERPRINTS = (
    ("fit_path", "fit_sha256"),
    ("hero_config_path", "hero_config_sha256"),
    ("results_path", "results_sha256"),
)


def verify(
    prereg_path: Path, *, run_dir: Path | None = None, wandb_path: str | None = None, run_dirs: list[Path] | None = None
) -> dict:
    """Recompute the seal; with a run, flag a preregistration created after its first logged step.
    A multi-seed seal's runs (`run_dirs`, one per sealed seed) are each verified so. Then everything
    else the file claims, against records it cannot edit: each fingerprinted input's sha256, the
    outcome file (consistent with the sealed rule, and recomputed from its runs' metrics logs where
    they exist), and the git commit that first added the seal against the runs' first steps."""
    runs = list(run_dirs) if run_dirs else ([Path(run_dir)] if run_dir is not None else [])
    result = _verify_runs(prereg_path, runs, wandb_path)
    return _against_records(prereg_path, result, runs)


def _against_records(prereg_path: Path, result: dict, runs: list[Path]) -> dict:
    doc = fmt.read(prereg_path)
    problems, result["fingerprints"] = fingerprint_problems(doc)
    warnings = result.setdefault("warnings", [])
    seal_anchor = first_commit(prereg_path)
    result["first_commit"] = seal_anchor.to_json()
    problems += [p for p in [seal_anchor.problem("the seal")] if p]
    warnings += [n for n in [seal_anchor.note("the seal")] if n]
    outcome = read_outcome(prereg_path)
    if outcome:
        outcome_anchor = first_commit(fmt.outcome_path(prereg_path))
        result["outcome_first_commit"] = outcome_anchor.to_json()
        problems += [p for p in [outcome_anchor.problem("the outcome")] if p]
        warnings += [n for n in [outcome_anchor.note("the outcome")] if n]
        problems += outcome_consistency(doc, outcome)
        scored = runs or outcome_run_dirs(outcome)
        if scored and len(scored) == len(target_seeds(doc) or [None]):
            problems += outcome_vs_records(prereg_path, outcome, scored)
            result["outcome_recomputed_from"] = [str(r) for r in scored]
    commit = seal_commit(prereg_path, seal_anchor)
    result["seal_commit"] = commit
    starts = [r.get("run_first_step_time") for r in result.get("runs", [result])]
    starts = [t for t in starts if isinstance(t, (int, float))]
    if commit is not None and starts:
        result["commit_before_start"] = commit["epoch"] <= min(starts)
        if not result["commit_before_start"]:
            warnings.append(
                f"the seal was first committed in {commit['commit'][:12]} at {commit['time']}, after the first step of a "
                "run it predicts: its creation time is the file's own word"
            )
    result["problems"] = result["problems"] + problems
    result["ok"] = not result["problems"]
    return result


def _verify_runs(prereg_path: Path, run_dirs: list[Path], wandb_path: str | None) -> dict:
    seeds = target_seeds(fmt.read(prereg_path))
    if seeds is not None and (wandb_path is not None or len(run_dirs) not in (0, len(seeds))):
        given = "--wandb" if wandb_path is not None else f"{len(run_dirs)} --run"
        raise DelphiError(
            f"--run: {prereg_path} seals the mean of seeds {', '.join(map(str, seeds))}: give one --run per "
            f"seed ({len(seeds)}), got {given}"
        )
    if len(run_dirs) > 1:
        base = _verify_one(prereg_path)
        doc = fmt.read(prereg_path)
        seeds = target_seeds(doc)
        if seeds is None or len(run_dirs) != len(seeds) or len({Path(r).resolve() for r in run_dirs}) != len(run_dirs):
            raise DelphiError(
                f"--run: {prereg_path} seals {'one run' if seeds is None else f'seeds {seeds}'}: give one "
                f"distinct --run per sealed seed, got {len(run_dirs)}"
            )
        runs = []
        for one in run_dirs:
            seed = run_seed(Path(one))
            if seed not in seeds or hero_mismatch(doc, prereg_path, Path(one), seed):
                raise DelphiError(f"--run {one}: not one of the sealed seeds {seeds} of the hero of {prereg_path}")
            runs.append(_verify_one(prereg_path, run_dir=Path(one), seed=seed))
        problems = base["problems"] + [f"seed run {r['run']}: {p}" for r in runs for p in r["problems"]]
        return base | {
            "runs": runs,
            "problems": problems,
            "ok": not problems,
            "created_before_start": all(r["created_before_start"] is True for r in runs),
        }
    return _verify_one(prereg_path, run_dir=run_dirs[0] if run_dirs else None, wandb_path=wandb_path)


def outcome_consistency(doc: dict, outcome: dict) -> list[str]:
    """Fields of an outcome file that contradict its own actual loss under the sealed prediction and
    decision rule (a verdict, error or coverage edited by hand)."""
    actual = outcome.get("actual_final_loss")
    if outcome.get("verdict") not in FINAL_VERDICTS or not isinstance(actual, (int, float)):
        return []
    final, tol = doc["prediction"]["final"], float(doc["decision"]["tolerance_rel"])
    rel = (float(actual) - float(final["loss"])) / float(final["loss"])
    expected = {"rel_error": rel, "verdict": "passed" if abs(rel) <= tol else "failed"}
    for key, field in (("loss_50", "covered_50"), ("loss_90", "covered_90")):
        if final.get(key) and field in outcome:
            expected[field] = bool(final[key][0] <= actual <= final[key][1])
    if outcome.get("why", "").startswith("run ") and outcome.get("verdict") == "failed":
        expected["verdict"] = "failed"  # diverged or failed runs fail whatever their last loss
    problems = [
        f"outcome field {k} = {outcome.get(k)!r}, but its actual_final_loss {actual!r} against the sealed prediction "
        f"gives {v!r}"
        for k, v in expected.items()
        if numbers_differ(outcome.get(k), v)
    ]
    sealed = (doc.get("seal") or {}).get("digest")
    if outcome.get("seal") is not None and outcome.get("seal") != sealed:
        problems.append(
            f"outcome field seal = {outcome.get('seal')!r}: it scored another seal, not this file's {sealed!r}"
        )
    seeds = outcome.get("seeds")
    finals = [s.get("actual_final_loss") for s in seeds] if isinstance(seeds, list) and seeds else []
    if finals and all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in finals):
        mean = sum(float(f) for f in finals) / len(finals)
        if numbers_differ(float(actual), mean):
            problems.append(
                f"outcome field actual_final_loss = {actual!r}, but the mean of its seeds' own final losses "
                f"({', '.join(f'{float(f):.6g}' for f in finals)}) is {mean!r}"
            )
    return problems


def outcome_run_dirs(outcome: dict) -> list[Path]:
    """The run dir(s) an outcome scored, where they still exist."""
    recorded = [r.get("run_dir") for r in outcome.get("runs", [])] if outcome.get("runs") else [outcome.get("run_dir")]
    return [Path(r) for r in recorded if isinstance(r, str) and Path(r).is_dir()]


def outcome_vs_records(prereg_path: Path, outcome: dict, run_dirs: list[Path]) -> list[str]:
    """Fields of an outcome file that its run(s)' own records (config, metrics log) do not give: the
    outcome recomputed by `check` (without recording) and compared field by field."""
    try:
        again, _, _ = check(prereg_path, run_dirs=run_dirs, record=False)
    except (DelphiError, CheckFailed) as e:
        return [f"the outcome cannot be recomputed from {', '.join(map(str, run_dirs))}: {e}"]
    return [
        f"outcome field {k} = {outcome.get(k)!r}, but the run's records give {again.get(k)!r}"
        for k in OUTCOME_FIELDS
        if k in outcome and numbers_differ(outcome.get(k), again.get(k))
    ]


def fingerprint_problems(doc: dict) -> tuple[list[str], dict[str, str]]:
    """Each fingerprinted input the seal names by path: problems where its file's sha256 differs from
    the one sealed, and for each key whether it was checked ("ok", "differs", "absent")."""
    prov = doc.get("provenance") or {}
    problems, checked = [], {}
    for path_key, sha_key in FINGERPRINTS:
        path, sealed = prov.get(path_key), prov.get(sha_key)
        if not isinstance(path, str) or not isinstance(sealed, str):
            continue
        if not Path(path).is_file():
            checked[sha_key] = "absent"
            continue
        ok = sha256_file(Path(path)) == sealed
        checked[sha_key] = "ok" if ok else "differs"
        if not ok:
            problems.append(
                f"provenance.{sha_key}: {path} no longer has the sha256 sealed for it (an input changed after the seal)"
            )
    return problems, checked


def seal_commit(prereg_path: Path, anchor: FirstCommit | None = None) -> dict[str, Any] | None:
    """The git commit that first added the seal file, and its commit time (epoch seconds): what anchors
    the seal's time outside the file itself. None outside a git checkout or for an uncommitted file."""
    anchor = anchor or first_commit(prereg_path)
    if anchor.commit is None:
        return None
    return {"commit": anchor.commit, "time": anchor.time, "epoch": anchor.epoch}


def _verify_one(
    prereg_path: Path, *, run_dir: Path | None = None, wandb_path: str | None = None, seed: int | None = None
) -> dict:
    doc = fmt.read(prereg_path)
    seal = fmt.seal_status(doc)
    result = {
        "file": str(prereg_path),
        "id": doc.get("id"),
        "created": doc.get("created"),
        "seal_ok": seal["ok"],
        "seal_recorded": seal["recorded"],
        "seal_computed": seal["computed"],
        "problems": [],
    }
    if not seal["ok"]:
        result["problems"].append("the seal does not match the content: the file was edited after it was sealed")
    if run_dir is not None and (mismatch := hero_mismatch(doc, prereg_path, run_dir, seed)):
        raise DelphiError(f"--run {run_dir}: not the preregistered hero of {prereg_path}: {mismatch}")
    if run_dir is not None or wandb_path is not None:
        run = read_run_dir(run_dir) if run_dir is not None else read_wandb(wandb_path)
        result["run"] = run.source
        result["run_first_step_time"] = run.first_step_time
        # it ran but when is gone (None), or it started first (False): the check cannot pass
        result["created_before_start"], problem = start_order(doc, run, run_dir)
        if problem:
            result["problems"].append(problem)
    result["forced"] = bool(doc.get("forced", False))
    if result["forced"]:
        failed = [
            g.get("name", "?") for g in doc.get("gates") or [] if not g.get("passed") and g.get("applicable", True)
        ]
        forced_gates = doc.get("forced_gates") or {}
        result["warnings"] = [
            f"sealed with {'gate(s) forced by the study' if set(failed) <= set(forced_gates) else '--force'} "
            f"although gates failed: {', '.join(failed)}"
            + "".join(f" ({n}: {forced_gates[n]})" for n in failed if n in forced_gates)
        ]
    result["ok"] = not result["problems"]
    return result
