"""Parameter and FLOP counts (Chinchilla, Hoffmann et al. 2022, Appendix F).

Forward FLOPs per token of a sequence of S tokens, kh = head size x heads:
    QKV 2*3*d*kh, QK logits 2*S*kh, softmax 3*H*S, attention x V 2*S*kh,
    output projection 2*kh*d, SwiGLU feed-forward 2*3*d*ffw, final logits 2*d*V.
MoE adds the router (2*d*E) and counts the k routed experts plus the shared
ones as active. Training = 3 x forward. Norms, RoPE and the residual adds are
elementwise and left out, as in Chinchilla.

The embedding lookup (Chinchilla's 2*S*V*d "embeddings" term) is a gather, not
a matmul: it is reported in the breakdown but not in `flops_per_token`, so the
count matches what the compiled step actually does (checked against XLA's
cost analysis in the tests).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from delphi.errors import DelphiError
from delphi.model.config import ModelConfig

TRAIN_FLOPS_PER_FORWARD = 3  # backward is 2x forward (Kaplan et al. 2020, sec. 2.1)
SOFTMAX_FLOPS_PER_LOGIT = 3  # Chinchilla Appendix F
# Training state per parameter: f32 master weight, f32 gradient and Adam's two f32 moments
# (optax.adamw), activations not counted: a lower bound on what training needs.
TRAIN_STATE_BYTES_PER_PARAM = 16
# A model past 1e15 parameters (PB of weights, ~1000x the largest published models) is a typo,
# not a plan: `delphi flops` refuses it instead of printing numbers for it.
MAX_PLAUSIBLE_PARAMS = 10**15


@dataclass(frozen=True)
class ParamCounts:
    total: int  # every trainable parameter
    active: int  # parameters a token touches (k routed + shared experts)
    nonembedding: int  # active, without the embedding and unembedding matrices (Kaplan's N)
    embedding: int  # input embedding + unembedding

    def as_dict(self) -> dict[str, int]:
        return {f"params_{k}": v for k, v in asdict(self).items()}


def count_params(cfg: ModelConfig) -> ParamCounts:
    d, L = cfg.d_model, cfg.n_layers
    kh = cfg.n_heads * cfg.d_head
    attention = 3 * d * kh + kh * d + 2 * cfg.d_head  # QKV, output, QK-norm gains
    norms = 2 * d  # pre-attention and pre-FFN RMSNorm gains
    if cfg.moe is None:
        ffn_total = ffn_active = 3 * d * cfg.d_ff
    else:
        moe = cfg.moe
        expert = 3 * d * moe.d_expert
        router = d * moe.experts
        ffn_total = router + (moe.experts + moe.shared_experts) * expert
        ffn_active = router + (moe.top_k + moe.shared_experts) * expert
    embedding = 2 * cfg.vocab_size * d  # untied input and output matrices
    final_norm = d
    total = L * (attention + norms + ffn_total) + final_norm + embedding
    nonembedding = L * (attention + norms + ffn_active) + final_norm
    return ParamCounts(total=total, active=nonembedding + embedding, nonembedding=nonembedding, embedding=embedding)


def expert_params(cfg: ModelConfig) -> int:
    """Parameters of the routed experts (the part a mesh's expert axis splits)."""
    if cfg.moe is None:
        return 0
    return cfg.n_layers * cfg.moe.experts * 3 * cfg.d_model * cfg.moe.d_expert


def train_state_bytes_per_device(cfg: ModelConfig, expert_shards: int = 1) -> int:
    """Lower bound on one device's training-state bytes: everything replicated except the routed
    experts, which are split over `expert_shards` devices."""
    experts = expert_params(cfg)
    per_device = count_params(cfg).total - experts + experts // max(expert_shards, 1)
    return TRAIN_STATE_BYTES_PER_PARAM * per_device


def check_plausible_size(cfg: ModelConfig, where: str = "model") -> None:
    """Refuse a parameter count no machine could hold (a typo such as d_model: 1000000000)."""
    total = count_params(cfg).total
    if total > MAX_PLAUSIBLE_PARAMS:
        raise DelphiError(
            f"{where}: d_model={cfg.d_model}, n_layers={cfg.n_layers} gives {total:.3g} parameters, "
            f"more than {MAX_PLAUSIBLE_PARAMS:.0e}; expected a model size that some machine can hold"
        )


def forward_flops_breakdown(cfg: ModelConfig, seq_len: int) -> dict[str, float]:
    """Forward FLOPs per token, by term (all layers summed)."""
    d, L, S, V = cfg.d_model, cfg.n_layers, seq_len, cfg.vocab_size
    kh = cfg.n_heads * cfg.d_head
    terms = {
        "embeddings": 2.0 * V * d,
        "qkv": L * 2.0 * 3 * d * kh,
        "qk_logits": L * 2.0 * S * kh,
        "softmax": L * float(SOFTMAX_FLOPS_PER_LOGIT * cfg.n_heads * S),
        "attention_values": L * 2.0 * S * kh,
        "attention_output": L * 2.0 * kh * d,
        "router": 0.0,
        "feed_forward": L * 2.0 * 3 * d * cfg.d_ff,
        "logits": 2.0 * d * V,
    }
    if cfg.moe is not None:
        moe = cfg.moe
        terms["router"] = L * 2.0 * d * moe.experts
        terms["feed_forward"] = L * 2.0 * 3 * d * moe.d_active_ffn
    return terms


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Exact training FLOPs per token (3 x forward, embedding lookup excluded)."""
    terms = forward_flops_breakdown(cfg, seq_len)
    return TRAIN_FLOPS_PER_FORWARD * (sum(terms.values()) - terms["embeddings"])


def palm_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Model FLOPs per token for MFU, PaLM convention (Chowdhery et al. 2022, App. B):
    6N + 12 L d S with N the active non-embedding parameters plus the output head."""
    n = count_params(cfg).nonembedding + cfg.vocab_size * cfg.d_model
    return 6.0 * n + 12.0 * cfg.n_layers * cfg.d_model * seq_len


def flops_summary(cfg: ModelConfig, seq_len: int) -> dict[str, float | int]:
    """What `delphi flops --json` prints (docs/design.md §3.1)."""
    check_plausible_size(cfg)
    counts = count_params(cfg)
    return {
        **counts.as_dict(),
        "seq_len": seq_len,
        "flops_per_token": flops_per_token(cfg, seq_len),
        "flops_per_token_6n": 6.0 * counts.nonembedding,
        "flops_per_token_palm": palm_flops_per_token(cfg, seq_len),
        "forward_breakdown": forward_flops_breakdown(cfg, seq_len),
    }
