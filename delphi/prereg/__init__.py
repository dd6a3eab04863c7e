"""Preregistration: the evidence a seal is judged on, its gates, creating the sealed file, checking a run against it, verifying seals and outcomes, and the index."""
