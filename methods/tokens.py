"""A text's token count, kept per tokenizer: the runs of a sweep (one process) share their tasks' texts, and each
run's preflight and its task's groups would tokenize every one of them again."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1 << 16)
def token_count(tokenizer, text: str) -> int:
    """Tokens of `text` alone (no special tokens), counted once per tokenizer."""
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])
