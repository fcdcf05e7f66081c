"""The load-time self-check: passes on every family, catches a fast backend that is not exact, is cached,
and refuses a family without rotary positions before any weights load."""

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma4TextConfig, GPT2Config

from harness import selfcheck
from harness.errors import ConfigError
from harness.models import ModelSpec
from harness.runner import preflight
from methods.kv_prefix import KVPrefixBackend
from methods.positions import Rotary
from tests.conftest import COMMON, tiny_model, tiny_run_config


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMDEFRAG_CACHE", str(tmp_path / "cache"))


def test_the_self_check_passes_on_every_family(family_model, tokenizer):
    verdict = selfcheck.verify(KVPrefixBackend(family_model), tokenizer, ModelSpec("tiny", "tiny"))
    assert verdict["exact"] and verdict["logits_max_diff"] < 1e-4 and verdict["density_max_diff"] < 1e-5


def test_a_wrong_rotary_table_stops_the_run_with_one_clear_error(tokenizer):
    """Gemma-3 with its global layers given the sliding layers' table: what one table for all layers did."""
    model = tiny_model("gemma3")
    rotary = Rotary.of(model)
    assert len(set(rotary.table_of)) == 2                  # sliding and global layers, each its own table
    rotary.table_of = [rotary.table_of[0]] * len(rotary.table_of)
    with pytest.raises(ConfigError) as caught:
        selfcheck.verify(KVPrefixBackend(model), tokenizer, ModelSpec("tiny", "tiny"))
    message = str(caught.value)
    assert "\n" not in message and "model type 'gemma3_text'" in message and "backend=hidden_prefix" in message


@pytest.mark.parametrize("config, why", [
    (dict(global_head_dim=32), r"keys differ in \(heads, width\)"),                 # wider global layers
    (dict(global_head_dim=16, num_hidden_layers=4, num_kv_shared_layers=2,       # layers reuse others' keys
          layer_types=["sliding_attention", "full_attention"] * 2), "could not be traced"),
])
def test_what_the_store_cannot_hold_is_refused_at_load(tokenizer, config, why):
    model = AutoModelForCausalLM.from_config(Gemma4TextConfig(**{**COMMON, **config}, sliding_window=12)).eval()
    with pytest.raises(ConfigError, match=f"{why}.*use backend=hidden_prefix"):
        selfcheck.verify(KVPrefixBackend(model), tokenizer, ModelSpec("tiny", "tiny"))


def test_the_verdict_is_cached_per_model_and_dtype(llama, tokenizer, monkeypatch):
    spec = ModelSpec("tiny", "tiny")
    first = selfcheck.verify(KVPrefixBackend(llama), tokenizer, spec)
    monkeypatch.setattr(selfcheck, "compare", lambda *a: pytest.fail("the cached verdict was not used"))
    assert selfcheck.verify(KVPrefixBackend(llama), tokenizer, spec) == first
    with pytest.raises(pytest.fail.Exception):                      # another dtype is checked anew
        selfcheck.verify(KVPrefixBackend(llama.to(torch.bfloat16)), tokenizer, spec)


def test_a_family_without_rotary_positions_is_refused_before_its_weights_load(tmp_path, tiny_checkpoint,
                                                                                 monkeypatch):
    folder = tmp_path / "gpt2"
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=400, bos_token_id=1, eos_token_id=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for file in Path(tiny_checkpoint).iterdir():
        if "token" in file.name or "chat_template" in file.name:
            shutil.copy(file, folder / file.name)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    cfg = tiny_run_config(str(folder), "method=vanilla", "model.name=gpt2")
    with pytest.raises(ConfigError, match="backend=fast needs rotary positions; model type 'gpt2' has none: use "
                                          "backend=hidden_prefix"):
        preflight(cfg)
