"""muP coordinate check (docs/design.md §4.4; Yang et al. 2021, Tensor Programs V, sec. D.1).

Train the same model family at widths base..16x base for a few Adam steps with the muP
per-group learning rates, record the mean |activation| of every layer output after each
update, and fit the slope of log2(magnitude) against log2(width) per component. Under muP
the slopes are ~0; under standard parameterisation (one LR, one init std) updates grow with
width and the slopes are visibly positive, which shows the check can fail.

The training loop here is deliberately minimal and self-contained (optax Adam, per-group LR
multipliers from delphi.model.mup, no schedule, no weight decay, no clipping): it tests the
parameterisation, not the trainer.

The default is one layer, where a few seeds resolve every slope well inside the tolerance; with
more layers the FFN outputs are noise-limited, so pass more seeds too (docs/notebook.md §8.28 has
the measurements).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jaxtyping import Array, Int

from delphi.experiments.shapes import WidthFamily
from delphi.io import atomic_write_json
from delphi.model import mup
from delphi.model.config import ModelConfig, MoEConfig
from delphi.model.transformer import Transformer, cross_entropy
from delphi.plot.figures import coordcheck_figure
from delphi.plot.style import write_png

# Slope tolerances of OLMo-core's coordinate-check test (docs/design.md §4.4): each layer's output,
# and the whole model's output (the logits).
COMPONENT_SLOPE_TOLERANCE = (-0.05, 0.05)
MODEL_SLOPE_TOLERANCE = (-0.2, 0.1)
MODEL_COMPONENT = "logits"
COORDCHECK_PNG_DPI = 110


@dataclass(frozen=True)
class CoordCheckSpec:
    widths: tuple[int, ...] = (32, 64, 128, 256, 512)  # the first is the muP base width
    n_layers: int = 1  # see the module docstring: with 2 layers the FFN-output slopes are seed-noise-limited
    d_head: int = 16  # fixed head size: heads grow with width, as in muP practice
    ffn_mult: int = 4  # d_ff = ffn_mult * d_model; MoE: d_expert = d_model (granularity 4 with ffn_mult 4)
    moe: bool = False
    experts: int = 4
    top_k: int = 2
    mup: bool = True
    steps: int = 10  # Adam updates; magnitudes are read after each of them
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    lr: float = 3e-3  # base Adam LR (hidden matrices get lr / m under muP)
    seq_len: int = 16
    batch_size: int = 8

    @property
    def family(self) -> WidthFamily:
        # No load balancing: the check measures the parameterisation, not the router's dynamics.
        moe = MoEConfig(experts=self.experts, top_k=self.top_k, balance="none") if self.moe else None
        return WidthFamily(self.widths[0], self.n_layers, self.d_head, self.ffn_mult, moe=moe, mup=self.mup)

    def model_config(self, width: int) -> ModelConfig:
        return self.family.config(width, "coord_check")

    @property
    def label(self) -> str:
        return f"{'mup' if self.mup else 'sp'}-{'moe' if self.moe else 'dense'}"


@dataclass
class CoordCheckResult:
    spec: CoordCheckSpec
    # magnitude[component][i] = mean over seeds and steps of mean |activation| at widths[i]
    magnitude: dict[str, list[float]]
    # per_step[component][i][t] = mean over seeds at widths[i] after update t+1
    per_step: dict[str, list[list[float]]]
    slopes: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        x = np.log2(np.asarray(self.spec.widths, dtype=float))
        self.slopes = {c: float(np.polyfit(x, np.log2(np.asarray(m)), 1)[0]) for c, m in self.magnitude.items()}

    def tolerance(self, component: str) -> tuple[float, float]:
        return MODEL_SLOPE_TOLERANCE if component == MODEL_COMPONENT else COMPONENT_SLOPE_TOLERANCE

    @property
    def failing(self) -> list[str]:
        return [c for c, s in self.slopes.items() if not (self.tolerance(c)[0] <= s <= self.tolerance(c)[1])]

    @property
    def passed(self) -> bool:
        return not self.failing

    @property
    def worst_slope(self) -> float:
        return max(self.slopes.values(), key=abs)

    def summary(self) -> str:
        lines = [
            f"coordinate check {self.spec.label}: widths {list(self.spec.widths)}, "
            f"{len(self.spec.seeds)} seeds, {self.spec.steps} Adam steps, lr {self.spec.lr:g}"
        ]
        for c, s in self.slopes.items():
            lo, hi = self.tolerance(c)
            ok = "ok  " if lo <= s <= hi else "FAIL"
            lines.append(f"  {ok} {c:<18} slope {s:+.3f}  (tolerance [{lo:+.2f}, {hi:+.2f}])")
        lines.append(
            f"  => {'PASS' if self.passed else 'FAIL'} ({len(self.failing)} of {len(self.slopes)} outside tolerance)"
        )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.spec.label,
            "spec": dataclasses.asdict(self.spec),
            "passed": self.passed,
            "failing": self.failing,
            "slopes": self.slopes,
            "worst_slope": self.worst_slope,
            "magnitude": self.magnitude,
            "per_step": self.per_step,
            "tolerance": {"component": COMPONENT_SLOPE_TOLERANCE, "model": MODEL_SLOPE_TOLERANCE},
        }


def text_batches(steps: int, batch_size: int, seq_len: int, seed: int) -> Int[Array, "steps batch seq_plus_1"]:
    """Byte windows of real text (this interpreter's argparse source), a pure function of the seed."""
    import argparse

    data = np.frombuffer(Path(argparse.__file__).read_bytes(), dtype=np.uint8)
    n_windows = len(data) // (seq_len + 1)
    windows = data[: n_windows * (seq_len + 1)].reshape(n_windows, seq_len + 1)
    rows = np.random.default_rng(seed).choice(
        n_windows, size=steps * batch_size, replace=n_windows < steps * batch_size
    )
    return jnp.asarray(windows[rows].reshape(steps, batch_size, seq_len + 1).astype(np.int32))


def make_optimizer(cfg: ModelConfig, params: Any, lr: float) -> optax.GradientTransformation:
    """Adam with the muP LR multiplier and eps of each parameter group."""
    eps = mup.adam_eps(cfg, 1e-8)
    groups = {g: optax.adam(lr * mup.lr_multiplier(cfg, g), b1=0.9, b2=0.95, eps=eps) for g in mup.GROUPS}
    return optax.multi_transform(groups, mup.param_labels(params))


def _run_width(spec: CoordCheckSpec, width: int) -> dict[str, np.ndarray]:
    """Mean |activation| per component, [seeds, steps], at one width (one compilation, every seed)."""
    cfg = spec.model_config(width)
    graphdef, params, rest = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
    tx = make_optimizer(cfg, params, spec.lr)

    def loss_fn(params, rest, batch):
        model = nnx.merge(graphdef, params, rest)
        logits, stats = model(batch[:, :-1], train=True, capture=True)
        return cross_entropy(logits, batch[:, 1:]) + stats["aux_loss"], stats["activations"]

    @jax.jit
    def run(params, rest, batches):
        def step(carry, batch):
            params, opt_state = carry
            (_, acts), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest, batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), acts

        _, acts = jax.lax.scan(step, (params, tx.init(params)), batches)
        return acts  # component -> [steps + 1]; entry t is measured after t updates

    out: dict[str, list[np.ndarray]] = {}
    for seed in spec.seeds:
        _, params, rest = nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)), nnx.Param, ...)
        acts = run(params, rest, text_batches(spec.steps + 1, spec.batch_size, spec.seq_len, seed))
        for c, v in acts.items():
            out.setdefault(c, []).append(np.asarray(v)[1:])  # skip t=0: zero-init logits are exactly 0
    return {c: np.stack(v) for c, v in out.items()}


def coord_check(spec: CoordCheckSpec) -> CoordCheckResult:
    per_width = [_run_width(spec, w) for w in spec.widths]
    components = list(per_width[0])
    magnitude = {c: [float(np.mean(pw[c])) for pw in per_width] for c in components}
    per_step = {c: [np.mean(pw[c], axis=0).tolist() for pw in per_width] for c in components}
    return CoordCheckResult(spec=spec, magnitude=magnitude, per_step=per_step)


def save_report(
    results: list[CoordCheckResult], out_dir: str | Path, *, passed: bool, written_by: str | None = None
) -> dict[str, Any]:
    """Write coordcheck.json and coordcheck.png into out_dir; return the JSON dict."""
    out_dir = Path(out_dir)
    report = {
        "passed": passed,
        "results": [r.to_json() for r in results],
        "json": str(out_dir / "coordcheck.json"),
        "plot": str(out_dir / "coordcheck.png"),
    }
    write_png(
        coordcheck_figure(report["results"]), out_dir / "coordcheck.png", dpi=COORDCHECK_PNG_DPI, written_by=written_by
    )
    atomic_write_json(out_dir / "coordcheck.json", report, written_by=written_by)
    return report


def expected_outcome(result: CoordCheckResult) -> bool:
    """muP must pass; standard parameterisation must fail (else the check cannot tell them apart)."""
    return result.passed if result.spec.mup else not result.passed
