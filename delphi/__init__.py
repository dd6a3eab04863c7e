"""Delphi: a scaling-law research toolkit with an embedded JAX trainer."""

__version__ = "0.1.0"
