"""The load-time self-check: passes on every family, catches a fast backend that is not exact, is cached.
(What is refused before any weights load: tests/test_families.py.)"""

import pytest
import torch

from harness import selfcheck
from harness.errors import ConfigError
from harness.models import ModelSpec
from methods.backends.kv_prefix import KVPrefixBackend
from methods.attention.positions import Rotary
from tests.conftest import tiny_model


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


def test_the_verdict_is_cached_per_model_and_dtype(llama, tokenizer, monkeypatch):
    spec = ModelSpec("tiny", "tiny")
    first = selfcheck.verify(KVPrefixBackend(llama), tokenizer, spec)
    monkeypatch.setattr(selfcheck, "compare", lambda *a: pytest.fail("the cached verdict was not used"))
    assert selfcheck.verify(KVPrefixBackend(llama), tokenizer, spec) == first
    with pytest.raises(pytest.fail.Exception):                      # another dtype is checked anew
        selfcheck.verify(KVPrefixBackend(llama.to(torch.bfloat16)), tokenizer, spec)
