"""A text's token count and its cut to a number of tokens, kept per tokenizer: the runs of a sweep (one process)
share their tasks' texts, and each run's preflight and its task's groups would tokenize every one of them again."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1 << 16)
def token_count(tokenizer, text: str, special: bool = False) -> int:
    """Tokens of `text` (with the tokenizer's special tokens where `special`), counted once per tokenizer."""
    return len(tokenizer(text, add_special_tokens=special)["input_ids"])


@functools.lru_cache(maxsize=1 << 12)
def cut(tokenizer, text: str, tokens: int) -> str:
    """`text` cut to its first `tokens` tokens (no special tokens), decoded: once per tokenizer."""
    return tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"][:tokens])
