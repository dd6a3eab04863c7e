"""Experiments on the parameterisation itself, above the trainer: the muP coordinate check and
the learning-rate transfer sweep (`delphi mup coord-check`, `delphi mup lr-sweep`)."""
