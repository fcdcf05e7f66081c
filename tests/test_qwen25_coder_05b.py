"""The embedded Qwen2.5-Coder-0.5B-Instruct (slow: joins, verifies and loads real weights; the first use in a fresh
cache also de-quantizes them, about 80 s): the fast backend is exact on it, and a run through the command works."""

import json
import os

import pytest

from harness.models import selfcheck
from harness.models.loading import ModelSpec, load
from methods.backends.kv_prefix import KVPrefixBackend
from tests.test_config import composed
from tests.test_smollm2 import memdefrag

pytestmark = pytest.mark.slow


def test_qwen25_coder_05b_loads_as_qwen2_with_its_chat_template_and_the_fast_backend_is_exact(tmp_path, monkeypatch):
    cfg = composed("model=qwen25_coder_05b")
    assert cfg.prompt == "chat" and cfg.method.tracer_layer is not None
    model, tokenizer = load(ModelSpec.of(cfg.model))
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 24
    assert model.config.max_position_embeddings == 32768 and tokenizer.chat_template
    monkeypatch.setenv("MEMDEFRAG_CACHE", str(tmp_path))      # a fresh verdict, not the cached one
    verdict = selfcheck.verify(KVPrefixBackend(model), tokenizer, ModelSpec.of(cfg.model))
    assert verdict["exact"] and verdict["fast_answer_as_truth"]


def test_a_memdefrag_run_on_qwen25_coder_05b_writes_its_records(tmp_path):
    out = tmp_path / "run"
    done = memdefrag("model=qwen25_coder_05b", "method=memdefrag_top1", "task.groups=1", "task.updates=2",
                     "max_new_tokens=4", "threads=2", "logger=none", f"hydra.run.dir={out}", cwd=os.getcwd())
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(r["beyond_window"] == 0 for r in records)
    info = json.loads((out / "run.json").read_text())
    assert info["self_check"]["exact"] and info["model"] == "qwen25_coder_05b"
