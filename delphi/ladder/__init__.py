"""Ladders: the spec, compute-optimal rungs with muP transfer, their execution (local or Ray), collection into a results table, hero sizing and the recipe check."""
