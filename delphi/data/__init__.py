"""Corpus sources, the byte tokenizer, token stores and the deterministic loader."""
