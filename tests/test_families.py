"""The family table: every decoder family either runs exactly or is refused in one line before its weights
load, with the true reason.

Exact: every family in tests/conftest.py FAMILIES (among them GPT-OSS's attention sinks, SmolLM3's and
Cohere2's layers without rotary positions, Falcon's `.h` stack with inline attention, DeepSeek-V3's
multi-head latent attention, Gemma-4's wider global heads): fast == hidden_prefix within 1e-4 (logits) and 1e-5 (densities against the
model's own eager attention) in tests/test_backends.py, and the load-time self-check passes in
tests/test_selfcheck.py. Refused: the rows below, checked on a folder holding only a config and a tokenizer.
"""

import re
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from transformers import (AutoModelForCausalLM, DeepseekV2Config, Gemma4TextConfig, GPT2Config, Lfm2Config,
                          LlamaConfig, Llama4TextConfig, Phi3Config, Qwen3NextConfig)

from harness.errors import ConfigError
from harness.running.families import Outcome, causal_types, judged, survey, tiny_config, tiny_tokenizer
from harness.running.runner import preflight
from methods.backends.kv_prefix import KVPrefixBackend
from tests.conftest import COMMON, FAMILIES, NO_TENSORS, tiny_run_config

GEMMA4 = dict(COMMON, sliding_window=12)
STATEFUL = "keeps a recurrent or convolutional state, not per-token keys and values"
NO_ROTARY = "re-places keys through the family's rotary function"
REFUSED = {   # family: (config, backends refused, what the one line says)
    "gpt2": (lambda: GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=400, bos_token_id=1, eos_token_id=2),
             ["fast"], f"{NO_ROTARY}.*'gpt2'.*defines none"),                       # absolute positions
    "llama4_text": (lambda: Llama4TextConfig(**COMMON, no_rope_layers=[1, 0, 1], attention_chunk_size=64),
                    ["fast"], f"{NO_ROTARY}.*'llama4_text'.*defines none.*complex frequencies"),
    "deepseek_v2": (lambda: DeepseekV2Config(**{**COMMON, "head_dim": 8, "num_key_value_heads": 4}, kv_lora_rank=16,
                                             q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12,
                                             n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
                                             moe_intermediate_size=32),           # latent attention, complex RoPE
                    ["fast"], f"{NO_ROTARY}.*'deepseek_v2'.*defines none"),
    "phi3_longrope": (lambda: Phi3Config(**COMMON, original_max_position_embeddings=64, rope_parameters=dict(
        rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=64, short_factor=[1.0] * 8,
        long_factor=[1.0 + i / 2 for i in range(8)])),
                      ["fast"], r"'phi3' uses rope_type 'longrope', whose frequencies .*switching past 64\)"),
    "llama_dynamic": (lambda: LlamaConfig(**COMMON, rope_parameters=dict(rope_type="dynamic", factor=2.0,
                                                                         rope_theta=10000.0)),
                      ["fast"], r"model type 'llama' uses rope_type 'dynamic', whose frequencies transformers "),
    "gemma4_kv_shared": (lambda: Gemma4TextConfig(**{**GEMMA4, "num_hidden_layers": 4}, global_head_dim=16,
                                                  num_kv_shared_layers=2,
                                                  layer_types=["sliding_attention", "full_attention"] * 2),
                         ["fast"], r"stores each layer's own keys and values; model type 'gemma4_text' shares them "
                                   r"across layers \(layers \[2, 3\]"),
    "qwen3_next": (lambda: Qwen3NextConfig(**{**COMMON, "num_hidden_layers": 4}),
                   ["fast", "hidden_prefix"], f"'qwen3_next' has layers that latent memory cannot hold: "
                                              f"linear_attention \\(layers 0-2\\) {STATEFUL}.*neither backend can run it"),
    "lfm2": (lambda: Lfm2Config(**{**COMMON, "num_hidden_layers": 4}, full_attn_idxs=[1, 3]),
             ["fast", "hidden_prefix"], f"'lfm2' has layers that latent memory cannot hold: conv \\(layers 0, 2\\) {STATEFUL}"),
}


@pytest.fixture
def config_only(tmp_path, tiny_checkpoint, monkeypatch):
    """A folder with a family's config and the tiny tokenizer, no weights; loading any weights fails the test."""
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))

    def save(config) -> str:
        folder = tmp_path / config.model_type
        config.save_pretrained(folder)
        (folder / "model.safetensors").write_bytes(NO_TENSORS)    # never read: refused before weights load
        for file in Path(tiny_checkpoint).iterdir():
            if "token" in file.name or "chat_template" in file.name:
                shutil.copy(file, folder / file.name)
        return str(folder)
    return save


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_a_family_that_cannot_be_latent_memory_is_refused_in_one_line_before_its_weights_load(family, config_only):
    make, refused, why = REFUSED[family]
    folder = config_only(make())
    for backend in ("fast", "hidden_prefix"):
        cfg = tiny_run_config(folder, "method=vanilla", f"model.name={family}", f"backend={backend}",
                              "allow_beyond_window=true")      # the family's check, not its 512-position window
        if backend not in refused:
            preflight(cfg)                          # the other backend takes it
            continue
        with pytest.raises(ConfigError, match=why) as caught:
            preflight(cfg)
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(f"model.source={folder!r}: " if len(refused) == 2 else "backend=fast ")
        assert len(refused) == 2 or message.endswith("use backend=hidden_prefix (the paper's formulation, slower) "
                                                     "for this model")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_exact_family_passes_the_checks_before_weights(family):
    KVPrefixBackend.check(FAMILIES[family]())


@pytest.mark.parametrize("family", sorted(f for f, (_, refused, _) in REFUSED.items() if refused == ["fast"]))
def test_what_only_the_fast_backend_refuses_runs_on_the_hidden_prefix_backend(family, tokenizer):
    """The refusal points to backend=hidden_prefix: it must answer and trace there."""
    from methods.formation import Former
    from methods.backends.hidden_prefix import HiddenPrefixBackend
    from methods.memory import LatentMemory

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(REFUSED[family][0]()).eval()
    former, memory = Former(model, tokenizer, "shared_sink", keep_kv=False, keep_states=True), LatentMemory()
    for text in ("the cat sat on the mat", "a quick brown fox jumps"):
        former.store(memory, text)
    prompt = torch.tensor(tokenizer("where is the cat?", add_special_tokens=False)["input_ids"])
    backend = HiddenPrefixBackend(model)
    logits, _, position = backend.prefill(memory, prompt)
    rows = backend.attention_rows(memory, prompt, [0, 1])
    assert torch.isfinite(logits).all() and position == 1 + memory.n_tokens + len(prompt)
    assert rows[1].shape == (len(prompt), position) and torch.isfinite(rows[1]).all()


@pytest.mark.parametrize("config_class", ["GPTJConfig", "CodeGenConfig"])
def test_a_rotary_function_taking_sin_before_cos_is_read_by_name_and_refused_truthfully(config_class, tokenizer):
    """GPT-J and CodeGen: f(tensor, sin, cos), tables from a buffer of the attention rather than the decoder's
    rotary embedding: the probe reads the rotated tensor by name (it took `sin` for one and raised IndexError),
    and the fast backend refuses in one line why it cannot place their keys."""
    import transformers

    from methods.attention.positions import RotaryError, modeling_module, rotated_parameters
    from methods.formation import Former
    from methods.memory import LatentMemory

    config = getattr(transformers, config_class)(vocab_size=128, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                                 n_positions=512, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert rotated_parameters(modeling_module(model).apply_rotary_pos_emb) == ["tensor"]
    with pytest.raises(RotaryError, match="its cached keys could not be traced to one rotation"):
        Former(model, tokenizer, keep_kv=True).store(LatentMemory(), "the cat sat")


def test_a_model_that_fails_while_it_is_checked_ends_the_run_in_one_line(monkeypatch):
    """Whatever a model raises while it loads or the backend is checked on it: one line naming the source, its
    type, the step and the cause (no traceback)."""
    from harness.running import runner
    from harness.models.loading import ModelSpec

    monkeypatch.setattr(runner, "load", lambda spec: (torch.nn.Linear(1, 1), None))
    monkeypatch.setattr(runner.selfcheck, "verify", lambda *a: ().__getitem__(1))
    with pytest.raises(ConfigError) as refused:
        runner.ready(ModelSpec("m", "/models/m"), "fast")
    assert str(refused.value) == ("model.source='/models/m' (model type 'unknown') failed while checking "
                                  "backend=fast on it: IndexError: tuple index out of range; this harness cannot "
                                  "run it with backend=fast")


COMMITTED = Path(__file__).resolve().parents[1] / "results" / "families.md"


def committed_outcomes() -> dict[str, str]:
    """The committed table's outcome per type, where it was made with the installed transformers (else none)."""
    text = COMMITTED.read_text()
    if f"transformers {transformers.__version__} " not in text.splitlines()[0]:
        return {}
    return {cells[1]: cells[2] for line in text.splitlines()
            if len(cells := [c.strip() for c in line.split("|")]) == 5 and cells[2] in set(Outcome)}


@pytest.fixture(scope="module")
def shared_tokenizer():
    return tiny_tokenizer()


@pytest.mark.parametrize("model_type", causal_types())
def test_every_causal_lm_type_is_exact_or_refused_in_one_line_naming_it(model_type, shared_tokenizer):
    """Each type of the installed transformers' causal-LM mapping, built tiny from its own config class, runs
    exactly or is refused in one line naming its type (a traceback fails the row); one transformers cannot
    build tiny is listed with transformers' own error. With the transformers the committed table was made
    with, each type's outcome is the committed one (results/families.md, `python -m harness.running.families`)."""
    [row] = survey([model_type], shared_tokenizer)
    assert row.outcome in set(Outcome) and "\n" not in row.detail
    if row.outcome not in (Outcome.exact, Outcome.not_built):     # the type its checkpoint declares (gpt-sw3's
        assert re.search(r"model type '[\w.-]+'", row.detail)       # is gpt2, a multimodal one's its text part's)
    if row.outcome == Outcome.not_built:
        assert row.detail
    expected = committed_outcomes().get(model_type)
    assert expected in (None, row.outcome), f"{model_type}: {row.outcome} ({row.detail}), committed: {expected}"


def test_the_readmes_family_counts_are_the_committed_tables():
    """docs/reliability.md's statement of supported families quotes results/families.md: its version and its
    counts."""
    table = COMMITTED.read_text()
    version = re.search(r"transformers (\S+) ", table.splitlines()[0]).group(1)
    counts = dict(re.findall(r"^\| (\w+) \| (\d+) \|$", table, re.MULTILINE))
    readme = " ".join((COMMITTED.parents[1] / "docs" / "reliability.md").read_text().split())
    statement = re.search(rf"with transformers {re.escape(version)}, of (\d+) types: (.*?), and no traceback", readme)
    assert statement, f"docs/reliability.md states no family counts for transformers {version}"
    assert int(statement.group(1)) == sum(map(int, counts.values()))
    said = {words.replace(" ", "_").replace("-", "_"): number for number, words in re.findall(r"(\d+) ([a-z -]+?)(?: \(|,|$)",
                                                                             statement.group(2))}
    assert said == counts


def test_a_refusal_names_the_other_backend_only_where_that_one_holds_the_model():
    """GPT-2 (absolute positions) and Bloom (ALiBi, no rotary function): the fast backend refused, saying which,
    pointing to hidden_prefix, which holds them. Gemma-3n
    (shared keys and values, and AltUp's several hidden streams per token): refused on either backend before its
    weights load, in one line giving both reasons, pointing nowhere."""
    from harness.models.selfcheck import refuse_unsupported
    from methods.backends.hidden_prefix import HiddenPrefixBackend
    from methods.backends.kv_prefix import KVPrefixBackend

    for kind, how in (("gpt2", "applies its positions some other way (absolute embeddings"),
                      ("bloom", "adds ALiBi's bias in its attention")):        # ALiBi without a rotary function
        with pytest.raises(ConfigError, match=rf"^backend=fast .*defines none: it {re.escape(how)}.*: use "
                                              rf"backend=hidden_prefix \(the paper's formulation"):
            refuse_unsupported(KVPrefixBackend, tiny_config(kind))
        HiddenPrefixBackend.check(tiny_config(kind))
    for backend in (KVPrefixBackend, HiddenPrefixBackend):
        with pytest.raises(ConfigError) as refused:
            refuse_unsupported(backend, tiny_config("gemma3n_text", 4))
        line = str(refused.value)
        assert line.startswith(f"backend={backend.name} ") and "\n" not in line and "use backend" not in line
        assert "shares them across layers" in line and "hidden streams per token between its layers" in line
        assert "neither can backend=" in line


def test_gemma3n_without_shared_layers_is_refused_in_one_line_for_its_several_hidden_streams(tmp_path, shared_tokenizer):
    """Gemma-3n's layers take AltUp's several hidden streams per token (once a traceback from the store)."""
    config = tiny_config("gemma3n_text", 4)
    config.num_kv_shared_layers, config.layer_types = 0, ["sliding_attention", "full_attention"] * 2
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    shared_tokenizer.save_pretrained(tmp_path)
    outcome, line = judged("gemma3n_text", tmp_path)
    assert outcome == Outcome.refused_at_load and "\n" not in line
    assert re.search(r"decoder layer 0 takes hidden states of shape \(4, 1, \d+, 64\), not one vector per token", line)
