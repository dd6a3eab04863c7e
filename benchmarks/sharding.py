"""Communication volume of expert parallelism, read from the compiled HLO.

    .venv/bin/python benchmarks/sharding.py                       # 8 simulated CPU devices, mesh 2 x 4
    .venv/bin/python benchmarks/sharding.py --data 1 --expert 8 --experts 16 --batch 32 --seq 128

Compiles one training step and one evaluation step of a MoE config on a (data, expert) mesh and
sums the operand bytes of every all-to-all in the compiled HLO (per device, per step), next to
the expected size

    train: layers x 2 (dispatch + combine) x 2 (forward + backward) x E x C x d_model x 4 bytes
    eval:  layers x 2 (dispatch + combine)                          x E x C x d_model x 4 bytes

with C = expert_capacity(tokens per device) (train: capacity_factor; eval: dropless, C = tokens
per device). On simulated devices this is not a speed test: all of them share the host's cores.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=int, default=2)
    p.add_argument("--expert", type=int, default=4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--d-expert", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--capacity-factor", type=float, default=1.25)
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    devices = args.data * args.expert
    if "jax" in sys.modules and "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        raise SystemExit("run as a script: XLA_FLAGS must be set before jax is imported")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if os.environ["JAX_PLATFORMS"] == "cpu":
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"

    import jax
    import numpy as np

    from delphi.model.config import ModelConfig, MoEConfig
    from delphi.model.moe import expert_capacity
    from delphi.train import sharding
    from delphi.train.config import DataConfig, MeshConfig, TrainConfig
    from delphi.train.optim import make_optimizer
    from delphi.train.step import TrainState, make_eval_step, make_train_chunk, split_model
    from delphi.train.trainer import init_model

    moe = MoEConfig(
        experts=args.experts, top_k=args.top_k, d_expert=args.d_expert, capacity_factor=args.capacity_factor
    )
    cfg = TrainConfig(
        model=ModelConfig(d_model=args.d_model, n_layers=args.layers, n_heads=max(1, args.d_model // 32), moe=moe),
        data=DataConfig(seq_len=args.seq, batch_size=args.batch),
        steps=10,
        precision=args.precision,
        mesh=MeshConfig(data=args.data, expert=args.expert),
    ).validate()
    mesh = sharding.make_mesh(cfg.mesh)
    graphdef, params, router_bias, other = split_model(init_model(cfg, mesh))
    tx = make_optimizer(cfg.model, cfg.optim, cfg.steps)
    state = TrainState(params, tx.init(params), router_bias, other)
    state_sh = sharding.state_shardings(state, mesh)
    state = sharding.place_state(state, state_sh)
    replicated = sharding.replicated(mesh)
    tokens = np.zeros((1, args.batch, args.seq + 1), np.int32)
    with jax.set_mesh(mesh):
        train_chunk = make_train_chunk(
            graphdef, tx, cfg.model, (state_sh, sharding.batch_sharding(mesh, 1), replicated)
        )
        train_hlo = (
            train_chunk.lower(state, sharding.place(tokens, sharding.batch_sharding(mesh, 1))).compile().as_text()
        )
        eval_sh = sharding.batch_sharding(mesh, 1)
        eval_step = make_eval_step(graphdef, (state_sh, eval_sh, replicated))
        weights = np.ones(tokens.shape[:2], np.float32)
        eval_hlo = (
            eval_step.lower(state, sharding.place(tokens, eval_sh), sharding.place(weights, eval_sh))
            .compile()
            .as_text()
        )

    local_tokens = cfg.tokens_per_step // devices
    capacity_train = expert_capacity(local_tokens, args.top_k, args.experts, args.capacity_factor, train=True)
    capacity_eval = expert_capacity(local_tokens, args.top_k, args.experts, args.capacity_factor, train=False)
    train_ops, train_bytes = sharding.all_to_all_bytes(train_hlo)
    eval_ops, eval_bytes = sharding.all_to_all_bytes(eval_hlo)
    split = args.expert > 1
    expected_eval = args.layers * 2 * args.experts * capacity_eval * args.d_model * 4 if split else 0
    result = {
        "mesh": f"{args.data}x{args.expert}",
        "tokens_per_device": local_tokens,
        "capacity_train": capacity_train,
        "capacity_eval": capacity_eval,
        "train_all_to_all_ops": train_ops,
        "train_all_to_all_bytes": train_bytes,
        "train_expected_bytes": sharding.expected_all_to_all_bytes(cfg),
        "eval_all_to_all_ops": eval_ops,
        "eval_all_to_all_bytes": eval_bytes,
        "eval_expected_bytes": expected_eval,
    }
    print(
        f"mesh data x expert = {result['mesh']} ({jax.device_count()} {jax.devices()[0].platform} devices), "
        f"E={args.experts} k={args.top_k} d_model={args.d_model} layers={args.layers} "
        f"tokens/step={cfg.tokens_per_step} ({local_tokens}/device)"
    )
    for phase, c in (("train step", capacity_train), ("eval step", capacity_eval)):
        key = phase.split()[0]
        got, want, ops = (
            result[f"{key}_all_to_all_bytes"],
            result[f"{key}_expected_bytes"],
            result[f"{key}_all_to_all_ops"],
        )
        verdict = "match" if got == want else "MISMATCH"
        print(f"  {phase}: {ops} all-to-all, {got:,} bytes/device; expected {want:,} (capacity {c}) -> {verdict}")
    return result


if __name__ == "__main__":
    main()
