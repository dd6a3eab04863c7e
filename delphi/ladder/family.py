"""The ladder's shape family as a FLOPs family: N against the exact FLOPs per token of each shape,
along the spec's width grid extended far past the ladder (what a fit extrapolates along; the
allocation's FlopsFamily, delphi.fits.allocation)."""

from __future__ import annotations

from delphi.errors import DelphiError, quoted
from delphi.fits.allocation import FLOPS_PER_PARAM_TOKEN, PARAM_CONVENTIONS, FlopsFamily
from delphi.ladder.plan import shape_for_width
from delphi.ladder.spec import LadderSpec
from delphi.model.config import ModelConfig
from delphi.model.flops import count_params, flops_per_token

# The family a fit extrapolates along reaches far past the ladder: 64x its largest width by default
# (interfaces.md section 2), i.e. ~4e3x in N at fixed depth ratio, past any hero this toolkit plans.
FAMILY_WIDTH_REACH = 64


def family_widths(spec: LadderSpec, max_width: int | None = None) -> list[int]:
    """The ladder's widths plus every multiple of shape.hero_width_multiple up to max_width."""
    multiple = spec.shape.hero_width_multiple
    top = max_width if max_width is not None else FAMILY_WIDTH_REACH * max(spec.shape.widths)
    if top < max(spec.shape.widths):
        raise DelphiError(f"max_width: {top} is below the ladder's largest width {max(spec.shape.widths)}")
    return sorted(set(spec.shape.widths) | set(range(multiple, top + 1, multiple)))


def params_in_convention(model: ModelConfig, seq_len: int, convention: str) -> float:
    """N of `model` counted as `convention` (delphi.fits.allocation.PARAM_CONVENTIONS)."""

    if convention == "nonembedding":
        return float(count_params(model).nonembedding)
    if convention == "active":
        return float(count_params(model).active)
    if convention == "fpt6":
        return flops_per_token(model, seq_len) / FLOPS_PER_PARAM_TOKEN
    raise DelphiError(f"--convention: {quoted(convention)}, expected one of {', '.join(PARAM_CONVENTIONS)}")


def flops_family(spec: LadderSpec, convention: str = "nonembedding", max_width: int | None = None) -> FlopsFamily:
    """The spec's shape family (its width grid extended by hero_width_multiple steps up to max_width,
    default 64x the largest ladder width) as (N, exact flops_per_token at spec.seq_len).

    Returns a `delphi.fits.allocation.FlopsFamily`; at every width of the grid its value is the exact
    `flops_per_token` of that shape (the fit interpolates between them in log-log)."""

    points: dict[float, float] = {}
    for w in family_widths(spec, max_width):
        model = shape_for_width(spec, w)
        n = params_in_convention(model, spec.seq_len, convention)
        points.setdefault(n, flops_per_token(model, spec.seq_len))  # equal N: the narrower shape
    params = sorted(points)
    top = max_width if max_width is not None else FAMILY_WIDTH_REACH * max(spec.shape.widths)
    return FlopsFamily(
        params=tuple(params),
        flops_per_token=tuple(points[n] for n in params),
        convention=convention,
        source=f"ladder spec {spec.name!r} (seq_len {spec.seq_len}, widths up to {top})",
    )
