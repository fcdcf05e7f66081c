"""The second embedded model, Gemma-3-270M (slow: loads real weights)."""

import pytest

from harness.models import selfcheck
from harness.models.loading import ModelSpec, load
from methods.backends.kv_prefix import KVPrefixBackend
from methods.attention.positions import Rotary
from tests.test_config import composed

pytestmark = pytest.mark.slow


def test_gemma3_270m_loads_with_a_plain_prompt_and_the_fast_backend_is_exact(tmp_path, monkeypatch):
    cfg = composed("model=gemma3_270m")
    assert cfg.prompt == "plain" and cfg.method.tracer_layer is not None
    model, tokenizer = load(ModelSpec.of(cfg.model))
    rotary = Rotary.of(model)
    global_layers = [i for i, kind in enumerate(model.config.layer_types) if kind == "full_attention"]
    assert {rotary.table_of[i] for i in global_layers}.isdisjoint(rotary.table_of[i] for i in range(18)
                                                                   if i not in global_layers)
    monkeypatch.setenv("MEMDEFRAG_CACHE", str(tmp_path))      # a fresh verdict, not the cached one
    verdict = selfcheck.verify(KVPrefixBackend(model), tokenizer, ModelSpec.of(cfg.model))
    assert verdict["exact"] and verdict["fast_logits_error"] < 1e-3
