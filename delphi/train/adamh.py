"""AdamH: Adam's direction, a step of fixed relative size, projected back onto each matrix's sphere.

For every AdamH matrix W (initial Frobenius norm r = ||W0||), one update is

    u  = m_hat / (sqrt(v_hat) + eps)                 Adam's bias-corrected direction
    W' = W - eta * r * u / ||u||                     a step of relative size eta
    W <- W' * r / ||W'||                             back onto the sphere of radius r

so W moves by ~eta of its own norm per step whatever its width, and its norm never changes: the
constraint takes weight decay's role, and there is no weight decay (Marin's "Scaling laws that
extrapolate", levanter.optim.adamh). Norms are per matrix: the leading axes of a parameter
[*stack, fan_in, fan_out] index independent matrices (the routed experts [E, d, f]). The radii are
kept in the optimizer state, so a resumed run restores them. The groups AdamH updates, why the
others keep Adam, and how it meets muP: docs/design.md §4.4.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float

__all__ = [
    "ADAMH_GROUPS",
    "MATRIX_AXES",
    "AdamHState",
    "adamh",
    "matrix_norms",
    "project_to_sphere",
    "scale_by_sphere_projection",
]

# The muP groups whose matrices are updated by AdamH; every other group gets plain Adam.
ADAMH_GROUPS: tuple[str, ...] = ("hidden",)
# The trailing axes that make one matrix; every axis before them indexes a stack of matrices.
MATRIX_AXES: tuple[int, int] = (-2, -1)
# Lower bound on a norm we divide by: a zero direction (no gradient yet) gives no step instead
# of a NaN. Far below any f32 matrix norm the model holds (sigma/sqrt(m) * sqrt(fan_in * fan_out)).
NORM_FLOOR = 1e-30

Schedule = Callable[[Any], Any]


def matrix_norms(x: Float[Array, "*stack rows cols"]) -> Float[Array, "*stack 1 1"]:
    """Frobenius norm of each matrix of a stack (the trailing two axes), kept as [..., 1, 1]."""
    return jnp.sqrt(jnp.sum(jnp.square(x), axis=MATRIX_AXES, keepdims=True))


def project_to_sphere(
    w: Float[Array, "*stack rows cols"],
    direction: Float[Array, "*stack rows cols"],
    radius: Float[Array, "*stack 1 1"],
    eta: Float[Array, ""] | float,
) -> Float[Array, "*stack rows cols"]:
    """normalize(W - eta * r * u / ||u||) * r for every matrix of the stack: a step of relative size
    eta along -u, then back onto the sphere of radius r (r = the matrix's initial norm)."""
    stepped = w - eta * radius * direction / jnp.maximum(matrix_norms(direction), NORM_FLOOR)
    return stepped * (radius / jnp.maximum(matrix_norms(stepped), NORM_FLOOR))


class AdamHState(NamedTuple):
    count: Any  # int32 scalar: updates done, the schedule's argument
    radius: Any  # per leaf: each matrix's initial Frobenius norm, [*stack, 1, 1]


def scale_by_sphere_projection(eta: Schedule | float) -> optax.GradientTransformation:
    """Turn a direction u (e.g. Adam's) into the update W_new - W of `project_to_sphere`.

    `eta(count)` is the relative step size of update `count` (0-based). Needs the params. Every
    leaf must be a matrix or a stack of them (ndim >= 2)."""
    eta_at = eta if callable(eta) else (lambda _count: eta)

    def init_fn(params: Any) -> AdamHState:
        def radius(w):
            if w.ndim < 2:
                raise ValueError(f"AdamH needs matrices (ndim >= 2), got a parameter of shape {w.shape}")
            return matrix_norms(w)

        return AdamHState(count=jnp.zeros([], jnp.int32), radius=jax.tree.map(radius, params))

    def update_fn(direction: Any, state: AdamHState, params: Any = None) -> tuple[Any, AdamHState]:
        if params is None:
            raise ValueError("scale_by_sphere_projection needs the params")
        step = eta_at(state.count)
        updates = jax.tree.map(
            lambda w, u, r: project_to_sphere(w, u.astype(w.dtype), r, step) - w, params, direction, state.radius
        )
        return updates, AdamHState(count=optax.safe_increment(state.count), radius=state.radius)

    return optax.GradientTransformation(init_fn, update_fn)


def adamh(eta: Schedule | float, b1: float, b2: float, eps: float) -> optax.GradientTransformation:
    """AdamH for a tree of matrices: Adam's bias-corrected direction, then the sphere projection."""
    return optax.chain(optax.scale_by_adam(b1=b1, b2=b2, eps=eps), scale_by_sphere_projection(eta))
