"""Prompt compression before formation (paper `tab:compression_comparison`): every fragment, targets and
distractors alike, is cut to a share `rate` of its tokens before it is formed. Compressed memory grows
more slowly, so under a capacity forgetting starts later.

A compressor turns a fragment's text into the token ids (in the memory model's tokenizer) that are
formed, in their original order; `compression=none` forms the text as it is.
"""

from __future__ import annotations


def kept_count(tokens: int, rate: float) -> int:
    """How many of a fragment's `tokens` a compressor at `rate` keeps: the nearest count, at least one."""
    return max(1, min(tokens, round(tokens * rate)))


class Compression:
    """The plugin kind: a fragment's text in, the ids to form out (once per text); it has no options."""

    label, rate = "none", 1.0

    def __init__(self):
        self._kept: dict[str, list[int] | None] = {}

    def __call__(self, text: str, model, tokenizer) -> list[int] | None:
        """`compress`, once per text: the distractors every group stores are compressed once per run."""
        if text not in self._kept:
            self._kept[text] = self.compress(text, model, tokenizer)
        return self._kept[text]

    def check(self) -> None:
        """Refuse (ValueError) what cannot be had here, before any model weights load."""

    def describe(self) -> dict:
        """What the results should say about the compressor."""
        return {"compressor": self.label, "rate": self.rate}

    def compress(self, text: str, model, tokenizer) -> list[int] | None:
        """The ids to form for `text` (without special tokens), or None to form the text as it is."""
        raise NotImplementedError


class NoCompression(Compression):
    def compress(self, text, model, tokenizer):
        return None


class Compressor(Compression):
    """A compression that keeps a share of each fragment's tokens. rate: that share, in (0, 1]."""

    def __init__(self, rate: float = 1.0):
        super().__init__()
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise ValueError(f"compression.rate={rate!r} must lie in (0, 1] (the share of tokens kept)")
        self.rate = float(rate)
