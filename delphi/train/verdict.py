"""The preregistration's verdict rule: a run's eval points against the sealed bands, and its final
loss against the sealed tolerance (`compare`). It sits beside the run reader (`delphi.train.runlog`)
so that `delphi prereg check`, `delphi plot prediction --run` and the study report judge a run alike.
"""

from __future__ import annotations

import math
from typing import Any

from delphi.prereg_format import Prereg
from delphi.train.runlog import RunState

FINAL_VERDICTS = ("passed", "failed")  # the verdicts an outcome file records


def compare(prereg: Prereg, run: RunState) -> dict[str, Any]:
    """Every eval point against the band, and the verdict (see the module docstring of delphi.prereg.check)."""
    tol = prereg.tolerance_rel
    points = []
    for e in run.evals:
        if e.tokens is None:
            continue
        bands = prereg.bands_at(e.tokens)
        if bands is None or not math.isfinite(e.loss):
            continue  # before the first predicted point (warmup) or a non-finite loss (handled by status)
        points.append(
            {
                "step": e.step,
                "tokens": e.tokens,
                "actual": e.loss,
                "predicted": bands["loss"],
                "lo90": bands["lo90"],
                "hi90": bands["hi90"],
                "rel_error": (e.loss - bands["loss"]) / bands["loss"],
                "in_50": bands["lo50"] <= e.loss <= bands["hi50"],
                "in_90": bands["lo90"] <= e.loss <= bands["hi90"],
            }
        )
    final_pred = prereg.final
    latest = next((e.tokens for e in reversed(run.evals) if e.tokens is not None), None)
    result: dict[str, Any] = {
        "prereg": prereg.id,
        "seal": prereg.doc.get("seal", {}).get("digest"),
        "run": run.source,
        "status": run.status,
        "tolerance_rel": tol,
        "predicted_final_loss": final_pred["loss"],
        "n_points": len(points),
        "n_outside_90": sum(not p["in_90"] for p in points),
        "points": points,
    }
    midway = {"n_evals": len(run.evals), "judged": judged(prereg, latest)}
    if run.status in ("diverged", "failed"):
        result |= {"verdict": "failed", "why": f"run {run.status}" + (f": {run.reason}" if run.reason else "")}
    elif run.status == "completed":
        actual = run.final_loss if run.final_loss is not None else (points[-1]["actual"] if points else _last_val(run))
        if actual is None:
            result |= {"verdict": "failed", "why": "run completed without a final val_loss"}
        else:
            rel = (actual - final_pred["loss"]) / final_pred["loss"]
            lo50, hi50 = final_pred.get("loss_50") or (None, None)
            lo90, hi90 = final_pred.get("loss_90") or (None, None)
            result |= {
                "verdict": "passed" if abs(rel) <= tol else "failed",
                "actual_final_loss": actual,
                "actual_final_bpb": run.final_bpb,
                "rel_error": rel,
                "covered_50": None if lo50 is None else bool(lo50 <= actual <= hi50),
                "covered_90": None if lo90 is None else bool(lo90 <= actual <= hi90),
                "why": f"final val_loss {actual:.4f} vs predicted {final_pred['loss']:.4f}: {rel:+.2%} (tolerance {tol:.2%})",
            }
            if run.kind == "log":
                result["why"] += f" ({run.reason})"
    elif not points and not run.evals:
        result |= {"verdict": "not-started", "why": "no eval point inside the predicted trajectory yet"}
    elif not points:
        last = run.evals[-1]
        result |= {
            "verdict": "in-progress",
            "latest_tokens": latest,
            "why": f"latest eval {last.loss:.4f}"
            + (f" at {last.tokens:.4g} tokens" if last.tokens is not None else "")
            + f"; {midway['judged']}",
        }
    else:
        last = points[-1]
        ok = last["in_90"] or abs(last["rel_error"]) <= tol
        result |= {
            "verdict": "on-track" if ok else "deviating",
            "rel_error": last["rel_error"],
            "latest_tokens": last["tokens"],
            "why": f"at {last['tokens']:.4g} tokens: {last['actual']:.4f} vs {last['predicted']:.4f} ({last['rel_error']:+.2%}), "
            f"{'inside' if last['in_90'] else 'outside'} the 90% band [{last['lo90']:.4f}, {last['hi90']:.4f}]",
        }
    if run.status == "stopped":
        result["why"] += f" (the run is stopped, to be resumed: {run.reason})"
    return (
        result if result["verdict"] in FINAL_VERDICTS else result | midway
    )  # an outcome file records the verdict alone


def judged(prereg: Prereg, latest_tokens: float | None) -> str:
    """What the seal can judge of a run whose latest eval is at `latest_tokens`, and against which band:
    the sealed trajectory's 90% band at each eval inside it, or (a seal of the final loss only, as one
    made from a table without ladder curves) nothing until the run reaches the hero's tokens."""
    xs, final = prereg.tokens, prereg.final
    lo, hi = final.get("loss_90") or (final["loss"], final["loss"])
    verdict_at = f"the verdict on the final loss at {xs[-1]:.4g} tokens ({final['loss']:.4f}, 90% [{lo:.4f}, {hi:.4f}])"
    share = "" if latest_tokens is None else f"; the latest eval is at {latest_tokens / xs[-1]:.0%} of them"
    if len(xs) == 1:
        return f"the seal predicts the final loss only: nothing to judge before {verdict_at}{share}"
    band = f"the sealed trajectory's 90% band ({len(xs)} points, {xs[0]:.4g} to {xs[-1]:.4g} tokens)"
    if latest_tokens is not None and latest_tokens < xs[0] * (1 - 1e-9):
        return f"nothing to judge before {xs[0]:.4g} tokens, where {band} starts; then each eval against it, and {verdict_at}{share}"
    return f"each eval against {band}; {verdict_at}{share}"


def _last_val(run: RunState) -> float | None:
    return run.evals[-1].loss if run.evals else None
