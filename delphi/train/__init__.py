"""Training: the config, the trainer (flax.nnx + optax), optimizers and schedules, checkpoints, run dirs, device placement, reading run logs and the verdict rule."""
