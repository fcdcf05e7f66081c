"""The load-time self-check: passes on every family, catches a fast backend that is not exact (in float32 and in
the low precisions, where it is judged against the float32 truth beside the paper's formulation in the same
dtype), is cached. (What is refused before any weights load: tests/test_families.py.)"""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from harness.models import selfcheck
from harness.errors import ConfigError
from harness.models.loading import ModelSpec
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.attention.positions import Rotary
from tests.conftest import COMMON, LLAMA31_ROPE, tiny_model

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMDEFRAG_CACHE", str(tmp_path / "cache"))


def test_the_self_check_passes_on_every_family(family_model, tokenizer):
    verdict = selfcheck.verify(KVPrefixBackend(family_model), tokenizer, ModelSpec("tiny", "tiny"))
    assert verdict["exact"] and verdict["fast_logits_error"] < 1e-4 and verdict["fast_density_error"] < 1e-5
    assert verdict["truth"] == "hidden_prefix in float32" and verdict["reference_logits_error"] == 0


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


def deep_llama(dtype: torch.dtype) -> torch.nn.Module:
    """A deep, narrow Llama-3.1 (32 layers, 64 wide) whose attention depends on position as a trained model's
    does (weights drawn 5x wider than transformers' default, which leaves a random model's attention nearly
    uniform and its positions nearly invisible); in bf16 its low precision is off the float32 truth by tenths
    of a logit, as a 32-layer 8B model's is."""
    torch.manual_seed(0)
    config = LlamaConfig(**{**COMMON, "num_hidden_layers": 32, "max_position_embeddings": 4096},
                         rope_parameters=LLAMA31_ROPE, initializer_range=0.1)
    return AutoModelForCausalLM.from_config(config).eval().to(dtype)


def off_by_one(model) -> None:
    """The fast backend places every memory key one position later than the formulation reads it."""
    rotary = Rotary.of(model)
    rotary.tables = lambda total, like: [c(like, torch.arange(1, total + 1, device=like.device).view(1, -1))
                                         for c in rotary.candidates]


def wrong_base(model) -> None:
    """The fast backend rotates memory keys with rotary base 10,000 where the model uses Llama-3.1's 500,000."""
    config = copy.deepcopy(model.config)
    config.rope_parameters = dict(rope_type="default", rope_theta=10000.0)
    Rotary.of(model).candidates = [LlamaRotaryEmbedding(config)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_correct_fast_path_passes_on_a_deep_model_in_every_precision(dtype, tokenizer):
    verdict = selfcheck.verify(KVPrefixBackend(deep_llama(dtype)), tokenizer, ModelSpec("tiny", "tiny"))
    assert verdict["exact"] and verdict["truth"] == "hidden_prefix in float32"
    assert verdict["dtype"] == str(dtype).removeprefix("torch.")
    assert (verdict["reference_logits_error"] > 0) == (dtype != torch.float32)    # low precision: judged by its noise


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("error", [off_by_one, wrong_base], ids=lambda f: f.__name__)
def test_an_injected_position_error_is_refused_in_every_precision(error, dtype, tokenizer):
    model = deep_llama(dtype)
    error(model)
    with pytest.raises(ConfigError) as caught:
        selfcheck.verify(KVPrefixBackend(model), tokenizer, ModelSpec("tiny", "tiny"))
    message = str(caught.value)
    assert "\n" not in message and "model type 'llama'" in message and "float32" in message and "allowed" in message


def test_the_float32_truth_leaves_the_model_as_it_was(tokenizer):
    """The check upcasts the weights in place and casts them back: every tensor equal, bit for bit, in its own
    dtype (the rotary table's float32 inverse frequencies stay float32)."""
    model = deep_llama(torch.bfloat16)
    model.model.rotary_emb.inv_freq.data = model.model.rotary_emb.inv_freq.float()
    before = {name: tensor.clone() for name, tensor in [*model.named_parameters(), *model.named_buffers()]}
    with selfcheck.in_float32(model):
        assert {t.dtype for t in model.parameters()} == {torch.float32}
    after = dict([*model.named_parameters(), *model.named_buffers()])
    assert all(after[name].dtype == t.dtype and torch.equal(after[name], t) for name, t in before.items())


def at_8b_init_scale(seed: int) -> torch.nn.Module:
    """A random bf16 Llama-3.1 drawn at the 8B checkpoint's init scale (std 0.02), 8 layers, a 4,096-token
    vocabulary: its logits lie as close together as a random 8B's do."""
    torch.manual_seed(seed)
    config = LlamaConfig(**{**COMMON, "num_hidden_layers": 8, "vocab_size": 4096, "max_position_embeddings": 4096},
                         rope_parameters=LLAMA31_ROPE, initializer_range=0.02)
    return AutoModelForCausalLM.from_config(config).eval().to(torch.bfloat16)


def near_tie(model, tokenizer) -> None:
    """The truth's first answer step made a near tie, as a 128k vocabulary often has one: the runner-up's row of
    the output layer becomes the top token's plus a difference 10x the init scale, orthogonal to the truth's last
    hidden state but for 1e-4 of a logit."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(args[0][0, -1].float()))
    with selfcheck.in_float32(model):
        truth, = selfcheck.outcomes(model, tokenizer, (HiddenPrefixBackend,), selfcheck.FRAGMENTS, (1, 0),
                                    selfcheck.QUESTION, "plain", 1)
    hook.remove()
    hidden = seen[1]                                     # after the rotary probe's forward: the prompt's last row
    top, second = truth.logits[-1].topk(2).indices.tolist()
    step = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(0)) * 0.2
    step -= (step @ hidden + 1e-4) / (hidden @ hidden) * hidden
    with torch.no_grad():
        model.lm_head.weight[second] = (model.lm_head.weight[top].float() + step).to(model.dtype)


def rounded_otherwise(model) -> None:
    """The fast backend's placed keys off by one unit of bf16 (their rotary tables by 2^-8 of their value): as a
    GPU's fast path and its reference differ by their kernels' rounding, which the CPU's identical arithmetic
    here does not show (without it both backends give the same bf16 logits)."""
    rotary = Rotary.of(model)
    exact = rotary.tables
    rotary.tables = lambda total, like: [(c * (1 + 2 ** -8), s * (1 + 2 ** -8)) for c, s in exact(total, like)]


@pytest.mark.parametrize("seed", range(1, 5))
def test_a_fast_path_leaving_the_truths_answer_at_a_near_tie_at_the_8b_init_scale_is_not_refused(seed, tokenizer):
    model = at_8b_init_scale(seed)
    near_tie(model, tokenizer)
    rounded_otherwise(model)
    verdict = selfcheck.verify(KVPrefixBackend(model), tokenizer, ModelSpec("tiny", "tiny"))
    assert verdict["exact"] and verdict["fast_logits_error"] <= verdict["logits_bound"]


@pytest.mark.parametrize("seed", range(1, 5))
@pytest.mark.parametrize("error", [off_by_one, wrong_base], ids=lambda f: f.__name__)
def test_an_injected_position_error_at_the_8b_init_scale_is_still_refused(error, seed, tokenizer):
    model = at_8b_init_scale(seed)
    near_tie(model, tokenizer)
    error(model)
    with pytest.raises(ConfigError):
        selfcheck.verify(KVPrefixBackend(model), tokenizer, ModelSpec("tiny", "tiny"))


def test_the_self_check_command_checks_a_checkpoint_folder_given_as_its_source(tiny_checkpoint, capsys, tmp_path):
    """`python -m harness.models.selfcheck --model hf --source <folder>`: a user's own checkpoint, both views, in a
    folder whose name holds what a Hydra override would parse (a comma, a space, a quote)."""
    import shutil

    source = shutil.copytree(tiny_checkpoint, tmp_path / "my ckpt,v2 'final'")
    selfcheck.main(["--model", "hf", "--source", str(source), "--fragments", "3", "--dtype", "float32"])
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")]
                        for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    table = [dict(zip(header, row)) for row in rows]
    assert [(row["model"], row["dtype"], row["exact"]) for row in table] == [("hf", "float32", "True")] * 2, table


def test_the_self_check_command_refuses_in_one_line_a_model_the_fast_backend_cannot_trace_once_loaded(tmp_path):
    """GPT-J passes the checks made before its weights load, and only its forward shows that its keys cannot be
    traced to one rotation: the command's one line (not a traceback) names it and the way out."""
    from transformers import GPTJConfig

    from harness.running.families import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(GPTJConfig(vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2, n_embd=64,
                                                n_layer=2, n_head=4, n_positions=4096, rotary_dim=8)
                                     ).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"^backend=fast: model type 'gptj': layer 0 rotates, .*: use "
                                          r"backend=hidden_prefix \(the paper's formulation, slower\) for this model$"):
        selfcheck.main(["--model", "hf", "--source", str(tmp_path), "--fragments", "3", "--dtype", "float32"])
