"""AdamH: Adam's direction, a step of fixed relative size, projected back onto each matrix's sphere.

For every AdamH matrix W (initial Frobenius norm r = ||W0||), one update is

    u  = m_hat / (sqrt(v_hat) + eps)                 Adam's bias-corrected direction
    W' = W - eta * r * u / ||u||                     a step of relative size eta
    W <- W' * r / ||W'||                             back onto the sphere of radius r

so W moves by ~eta of its own norm per step whatever its width, and its norm never changes: the
role weight decay played (holding the norm at an LR-dependent equilibrium) is taken by the
constraint, and there is no weight decay anywhere (Marin's "Scaling laws that extrapolate",
levanter.optim.adamh; the form and the groups below follow it, the code does not).

Norms are per matrix: a parameter of shape [*stack, fan_in, fan_out] is a stack of independent
matrices over its leading axes (the routed experts [E, d, f]; a stack of layers [L, ...] or of
both, were layers ever stacked) and each one keeps its own norm. Stacked seeds
(delphi.train.trainer.train_group) never reach the optimizer: the train step is vmapped over them.
The radius r of each matrix is taken at `init` and kept in the optimizer state, so the norm is
projected back to the initial one exactly at every step (no drift from rounding over 100k steps)
and a resumed run restores it with the rest of the state.

Groups under `optimizer: adamh` (the muP groups of delphi.model.mup; each tensor of the model):

    tensor                                    muP group     update        LR
    attention w_qkv, w_out                    hidden        AdamH         eta (optim.lr), no width term
    dense FFN w_in, w_out                     hidden        AdamH         eta
    routed experts w_in, w_out [E, d, f]      hidden        AdamH         eta, each expert its own norm
    shared experts w_in, w_out                hidden        AdamH         eta
    token embedding [V, d]                    embedding     Adam          adam_lr
    unembedding [d, V]                        unembedding   Adam          adam_lr
    router [d, E]                             router        Adam          adam_lr
    RMSNorm and QK-norm gains [d]             vector        Adam          adam_lr
    biases                                    (none)        -             the model has no bias Params; the
                                                                          MoE RouterBias is set by the
                                                                          DeepSeek-V3 balancing rule, never
                                                                          by the optimizer
Why these are not AdamH:
- embedding: a lookup table, each row is one token's vector updated only when the token is seen;
  one norm for the table would couple rare and frequent tokens (Marin: Adam).
- unembedding: zero-initialised under muP (mup.zero_init_unembedding), so it has no sphere to stay
  on; its forward multiplier alpha_out/m already makes a constant Adam LR the muP rule.
- router: d -> E with E fixed (muP's unembedding rule), initialised like it (sigma, logits x 1/m).
  Its norm is the scale of the gate logits, i.e. how sharply a token's top-k experts are weighted;
  pinned at its small init that scale could only grow through the norm gain in front of it. It
  keeps the free norm it had under AdamW; the router z-loss holds its logits in check.
- norm gains: vectors that start at 1, where a relative step on a sphere has no meaning.

muP under AdamH: the hidden step is relative to each matrix's own norm, and the norm stays at the
muP init sigma/sqrt(m), so the update's spectral size scales like the weight's: width-stable with
no 1/m on eta. The Adam groups keep their muP multipliers, which are all 1 (the table above:
embedding, unembedding with alpha_out/m, router with 1/m, gains): adam_lr transfers across width
as the AdamW LR of those groups did. Adam's eps keeps CompleteP's eps/(m*m_L) for every group:
it is compared with sqrt(v), whose scale per coordinate the parameterisation sets, not the optimizer.
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
