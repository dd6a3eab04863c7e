"""An independent plain-PyTorch peer of the JAX trainer's dense model, for same-run speed ratios.

    .venv/bin/python benchmarks/peer_torch.py --d-model 256 --layers 4 --seq 256 --batch 32 [--steps 24] [--bf16]

Written from the model's description (docs/design.md §4.1), not from delphi's code, and never
imported by the package: `benchmarks/trainer.py` runs it in a subprocess of the same invocation
(so torch's OpenMP threads never share a process with XLA's), right after the JAX trainer on the
same shape, and divides by its tokens/s. torch comes from the optional `bench` extra.

The model: byte vocabulary (256), untied input embedding and output head, L pre-norm blocks
[x += attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))], final RMSNorm. Attention: fused QKV
projection, QK-norm (RMSNorm over the head dimension), rotary embeddings (rotate-half layout),
causal softmax attention through `torch.nn.functional.scaled_dot_product_attention` (PyTorch's
fused CPU kernel, as nanoGPT uses). SwiGLU with one fused [gate | up] input projection. No biases.
AdamW (beta 0.9 / 0.95, weight decay 0.1) after global-norm clipping at 1.0, the trainer's
defaults. Eager mode: `torch.compile` needs a C++ toolchain and minutes of compile on CPU.

Each step samples its batch from a fixed random byte buffer on the host (the trainer also
assembles batches on the host). tokens/s is the median over intervals of `LOG_EVERY` steps
after `WARMUP_STEPS` untimed steps, like the trainer's logged tokens/s. `--bf16` runs the
matmuls under CPU autocast to bf16 (f32 weights); `benchmarks/trainer.py` asks for it only
where the CPU has native bf16 (avx512_bf16 or amx_bf16).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256  # bytes
LOG_EVERY = 8  # steps per timed interval (the trainer logs every 8 steps in benchmarks/trainer.py)
WARMUP_STEPS = 3  # untimed: first-touch allocation and oneDNN kernel selection
INIT_STD = 0.02  # GPT-2 / nanoGPT
ROPE_THETA = 10_000.0  # Su et al. 2021
NORM_EPS = 1e-6
LR, BETAS, WEIGHT_DECAY, GRAD_CLIP = 1e-3, (0.9, 0.95), 0.1, 1.0
DATA_BYTES = 1 << 20  # host buffer the batches are cut from


@dataclass(frozen=True)
class PeerShape:
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    seq_len: int
    batch: int


class Block(nn.Module):
    def __init__(self, s: PeerShape):
        super().__init__()
        self.n_heads, self.d_head = s.n_heads, s.d_model // s.n_heads
        self.attn_norm = nn.RMSNorm(s.d_model, eps=NORM_EPS)
        self.qkv = nn.Linear(s.d_model, 3 * s.d_model, bias=False)
        self.q_norm = nn.RMSNorm(self.d_head, eps=NORM_EPS)
        self.k_norm = nn.RMSNorm(self.d_head, eps=NORM_EPS)
        self.attn_out = nn.Linear(s.d_model, s.d_model, bias=False)
        self.ffn_norm = nn.RMSNorm(s.d_model, eps=NORM_EPS)
        self.ffn_in = nn.Linear(s.d_model, 2 * s.d_ff, bias=False)  # [gate | up]
        self.ffn_out = nn.Linear(s.d_ff, s.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.n_heads, self.d_head).unbind(2)
        q, k = rotate(self.q_norm(q), cos, sin), rotate(self.k_norm(k), cos, sin)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [b, heads, t, d_head]
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(att.transpose(1, 2).reshape(b, t, d))
        gate, up = self.ffn_in(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.ffn_out(F.silu(gate) * up)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of [b, t, heads, d_head]: pairs (x_i, x_{i + d_head/2}) by position angles."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class PeerModel(nn.Module):
    def __init__(self, s: PeerShape):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, s.d_model)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.n_layers))
        self.norm = nn.RMSNorm(s.d_model, eps=NORM_EPS)
        self.head = nn.Linear(s.d_model, VOCAB, bias=False)  # untied
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=INIT_STD)
        d_head = s.d_model // s.n_heads
        inv_freq = ROPE_THETA ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)
        angles = torch.arange(s.seq_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        # [t, 1, half]: broadcast over batch and heads
        self.register_buffer("cos", angles.cos()[:, None, :], persistent=False)
        self.register_buffer("sin", angles.sin()[:, None, :], persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.head(self.norm(x))


def measure(shape: PeerShape, steps: int, bf16: bool = False, seed: int = 0, threads: int | None = None) -> dict:
    """Train `steps` (rounded up to whole intervals) AdamW steps; tokens/s = median over intervals."""
    torch.manual_seed(seed)
    torch.set_num_threads(threads or os.cpu_count() or 1)
    model = PeerModel(shape)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, foreach=True)
    data = torch.from_numpy(np.random.default_rng(seed).integers(0, VOCAB, DATA_BYTES, dtype=np.int64))
    rng = np.random.default_rng(seed + 1)

    def step() -> float:
        starts = torch.from_numpy(rng.integers(0, DATA_BYTES - shape.seq_len - 1, shape.batch))
        window = data[starts[:, None] + torch.arange(shape.seq_len + 1)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        return float(loss.detach())

    for _ in range(WARMUP_STEPS):
        step()
    intervals = max(1, math.ceil(steps / LOG_EVERY))
    rates, loss = [], float("nan")
    started = time.perf_counter()
    for _ in range(intervals):
        t0 = time.perf_counter()
        for _ in range(LOG_EVERY):
            loss = step()
        rates.append(LOG_EVERY * shape.seq_len * shape.batch / (time.perf_counter() - t0))
    wall = time.perf_counter() - started
    return {
        **asdict(shape),
        "precision": "bf16" if bf16 else "f32",
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_mean": intervals * LOG_EVERY * shape.seq_len * shape.batch / wall,
        "tokens_per_s_spread": [min(rates), max(rates)],
        "steps": intervals * LOG_EVERY,
        "final_loss": loss,
        "params": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, help="SwiGLU width (default: 8 d / 3 rounded up to 16)")
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    d_ff = args.d_ff or -(-(8 * args.d_model) // 3 // 16) * 16
    shape = PeerShape(args.d_model, args.layers, args.heads, d_ff, args.seq, args.batch)
    print(json.dumps(measure(shape, args.steps, args.bf16, threads=args.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
