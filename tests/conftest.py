"""Fixtures: tiny random models of every supported family, a character tokenizer, the default model."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import (AutoModelForCausalLM, Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config,
                          Qwen3Config)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)
FAMILIES = {
    "llama": lambda: LlamaConfig(**COMMON),
    "qwen2": lambda: Qwen2Config(**COMMON),                      # projection biases
    "mistral": lambda: MistralConfig(**COMMON, sliding_window=None),
    "gemma2": lambda: Gemma2Config(**COMMON, sliding_window=12, query_pre_attn_scalar=16,
                                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    "qwen3": lambda: Qwen3Config(**COMMON),                      # QK-norm
}


class CharTokenizer:
    """A deterministic tokenizer over characters, with bos=1 and eos=2, and no chat template."""

    bos_token_id, eos_token_id, chat_template = 1, 2, None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([1] if add_special_tokens else []) + [3 + ord(c) % 120 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + (i - 3) % 26) for i in ids if i > 2)


def tiny_model(family: str):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(FAMILIES[family]()).eval()
    if family == "qwen2":                                     # make the biases matter
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.q_proj.bias, std=0.5)
            torch.nn.init.normal_(layer.self_attn.k_proj.bias, std=0.5)
    return model


@pytest.fixture(params=sorted(FAMILIES))
def family_model(request):
    return tiny_model(request.param)


@pytest.fixture
def llama():
    return tiny_model("llama")


@pytest.fixture
def tokenizer():
    return CharTokenizer()


FRAGMENTS = ["the cat sat on the mat", "a quick brown fox jumps", "hello world again and again", "zzz yy x",
             "a much longer fragment that crosses the sliding window of twelve"]


@pytest.fixture(scope="session")
def smollm2():
    from harness.models import ModelSpec, load
    return load(ModelSpec("smollm2", "smollm2"))
