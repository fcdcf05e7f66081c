"""The paper's backbones as shapes to build with random weights (timings, peak memory and self-checks on a GPU
need the architecture, not the trained weights), and the embedded SmolLM2 beside them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from harness.errors import ConfigError
from harness.models.loading import DTYPES, ModelSpec, check_source, grouped_sdpa_on_cpu, load, pick_device
from methods.memoryllm.checkpoint import MemoryLLMConfig


@dataclass(frozen=True)
class Shape:
    """A model architecture to build with random weights; tracer layer and query mode as the paper's."""
    config: dict
    tracer_layer: int
    query_mode: str
    config_class: type = LlamaConfig


LLAMA31_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)
SHAPES = {
    "llama31_8b": Shape(dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                             rms_norm_eps=1e-5, rope_parameters=LLAMA31_ROPE), 13, "last"),
    "tiny": Shape(dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768), 1, "mean"),
}
# MemoryLLM-8B: Llama-3-8B with a pool of 50 x 256 slots, LoRA adapters to write and read, a drop per layer (the
# authors' 8B training configs); its pool starts empty (the first injection fills it).
MEMORYLLM = dict(num_tokens=256, num_blocks=50, add_bos_embedding=True, drop_memory_per_layer=True,
                 add_decoder_lora=True, lora_config={"r": 8, "lora_alpha": 32,
                              "target_modules": ["q_proj", "v_proj", "k_proj", "up_proj", "down_proj", "gate_proj"]})
SHAPES["memoryllm_8b"] = Shape({**SHAPES["llama31_8b"].config, "max_position_embeddings": 8192,
                                "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, **MEMORYLLM},
                               13, "last", MemoryLLMConfig)
SHAPES["memoryllm_tiny"] = Shape({**SHAPES["tiny"].config, **MEMORYLLM, "num_tokens": 16, "num_blocks": 8},
                                 1, "last", MemoryLLMConfig)
# M+-8B: Llama-3.1-8B, 40 pool blocks and 10 retrieved from a long-term memory (its training config's retriever and
# merge settings); the long-term memory starts with one retrieval's worth of entries.
MPLUS = dict(num_ltm_blocks=10, ltm_initial_size=2560, update_ltm_frequency=60, decay_frequency=1,
             initial_rf_when_moving_stm_to_ltm=10, add_selector=True, selector_hidden_dim=256, num_selector_layers=2,
             add_encoder_retriever=True)
SHAPES["mplus_8b"] = Shape({**SHAPES["llama31_8b"].config, **MEMORYLLM, **MPLUS}, 13, "last", MemoryLLMConfig)
SHAPES["mplus_tiny"] = Shape({**SHAPES["memoryllm_tiny"].config, **MPLUS, "num_ltm_blocks": 2, "ltm_initial_size": 32,
                              "update_ltm_frequency": 2, "selector_hidden_dim": 8}, 1, "last", MemoryLLMConfig)
EMBEDDED = ModelSpec("smollm2", "smollm2", tracer_layer=18, query_mode="mean")


def tokenizer_of(folder: str | None):
    """The random shapes' tokenizer: the one in `folder` (a GPU node without the embedded model), or SmolLM2's,
    whose ids all lie inside every shape's vocabulary; one line where `folder` holds none."""
    if folder is None:
        return check_source(EMBEDDED)[1]
    if not Path(folder).is_dir():
        raise ConfigError(f"--tokenizer {folder}: not a folder; give a folder holding a tokenizer (tokenizer.json "
                          f"and tokenizer_config.json, as save_pretrained writes them)")
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"--tokenizer {folder}: no tokenizer can be loaded from it ({reason}); give a folder "
                          f"holding one (tokenizer.json and tokenizer_config.json, as save_pretrained writes them)")


def build(shape: str | None, device: str, dtype: str, tokenizer: str | None = None):
    """(model, tokenizer, tracer layer, query mode): the embedded SmolLM2, or a random model of `shape` (its
    prompts tokenized by the tokenizer in folder `tokenizer`, SmolLM2's by default)."""
    if shape is None:
        model, tokenizer = load(ModelSpec(EMBEDDED.name, EMBEDDED.source, dtype=dtype, device=device))
        return model, tokenizer, EMBEDDED.tracer_layer, EMBEDDED.query_mode
    chosen = SHAPES[shape]
    tokens = tokenizer_of(tokenizer)
    vocabulary = chosen.config["vocab_size"]
    if len(tokens) > vocabulary:
        raise ConfigError(f"--tokenizer {tokenizer}: {len(tokens)} ids do not fit shape {shape}'s vocabulary of "
                          f"{vocabulary}")
    torch.manual_seed(0)
    with torch.device(pick_device(device)):
        model = AutoModelForCausalLM.from_config(chosen.config_class(**chosen.config), dtype=DTYPES[dtype]).eval()
    grouped_sdpa_on_cpu(model)
    return model, tokens, chosen.tracer_layer, chosen.query_mode
