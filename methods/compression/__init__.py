"""Compression before formation: each fragment cut to a share of its tokens."""
