"""Backends: how a memory view is read as a per-layer prefix (fast keys/values, the paper's hidden prefix, text)."""
