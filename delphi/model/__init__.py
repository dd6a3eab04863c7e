"""The model: configs, the flax.nnx transformer and its MoE block, FLOP and parameter counts, muP multipliers."""
