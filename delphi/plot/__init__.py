"""Figures: pure functions from data to a matplotlib Figure, and the `delphi plot` commands that read files for them."""
