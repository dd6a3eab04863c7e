"""Learning-rate schedules as pure functions of the step.

Every schedule maps the 0-based index of an optimizer update to a multiple of
the peak LR, so `lr(step) = peak * factor(step)`. They are written against an
array module `xp`: `jnp` (default) inside the jitted step, where optax calls
them with the update count, and `numpy` on the host, where the curve law
(delphi.fits.curves) evaluates a whole run's schedule at once.

- constant: linear warmup, then the peak.
- wsd (warmup-stable-decay; Hu et al. 2024 "MiniCPM", Hagele et al. 2024):
  linear warmup, a long stable phase at the peak, then a decay over the last
  `decay_frac` of the steps to `min_lr_frac`, either linear or "1-sqrt"
  (Hagele et al. 2024, arXiv:2405.18392, found 1-sqrt best).
- cosine: linear warmup, then half a cosine from the peak to `min_lr_frac`.

Warmup starts at peak/warmup_steps (not 0) so the first update moves the
weights; the decay ends exactly at the floor on the last step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from delphi.train.config import OptimConfig

Schedule = Callable[[jnp.ndarray | int], jnp.ndarray]


def warmup_steps(optim: OptimConfig, steps: int) -> int:
    return int(round(optim.warmup_frac * steps))


def decay_steps(optim: OptimConfig, steps: int) -> int:
    return int(round(optim.decay_frac * steps))


def _warmup(step, n_warmup: int, xp):
    if n_warmup == 0:
        return xp.ones_like(step)
    return xp.minimum(1.0, (step + 1.0) / n_warmup)


def lr_factor_schedule(optim: OptimConfig, steps: int, xp=jnp) -> Schedule:
    """Return factor(step) in [min_lr_frac, 1] for the configured schedule.

    `xp` is the array module: jnp (f32, traceable) or numpy (f64, for the host)."""
    n_warmup = warmup_steps(optim, steps)
    floor = optim.min_lr_frac
    as_steps = (
        (lambda step: jnp.asarray(step, jnp.float32)) if xp is jnp else (lambda step: np.asarray(step, np.float64))
    )

    if optim.schedule == "constant":
        return lambda step: _warmup(as_steps(step), n_warmup, xp)

    if optim.schedule == "cosine":
        n_cos = max(steps - n_warmup, 1)

        def cosine(step):
            step = as_steps(step)
            progress = xp.clip((step + 1.0 - n_warmup) / n_cos, 0.0, 1.0)
            cos = floor + (1.0 - floor) * 0.5 * (1.0 + xp.cos(math.pi * progress))
            return xp.where(step < n_warmup, _warmup(step, n_warmup, xp), cos)

        return cosine

    if optim.schedule == "wsd":
        n_decay = decay_steps(optim, steps)
        decay_start = steps - n_decay

        def wsd(step):
            step = as_steps(step)
            progress = xp.clip((step + 1.0 - decay_start) / max(n_decay, 1), 0.0, 1.0)
            if optim.decay_shape == "sqrt":
                decayed = floor + (1.0 - floor) * (1.0 - xp.sqrt(progress))
            else:
                decayed = 1.0 - (1.0 - floor) * progress
            stable = _warmup(step, n_warmup, xp)
            return xp.where(step >= decay_start, xp.minimum(stable, decayed), stable)

        return wsd

    raise ValueError(f"unknown schedule {optim.schedule!r}")


def lr_schedule(optim: OptimConfig, steps: int) -> Schedule:
    """lr(step) for the base (multiplier 1) parameter group."""
    factor = lr_factor_schedule(optim, steps)
    return lambda step: optim.lr * factor(step)
