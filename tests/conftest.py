"""Fixtures: tiny random models of every supported family, a character tokenizer, the default model."""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import signal
import sys
from importlib.metadata import entry_points
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")    # before transformers reads it: no hub timeouts in tests
# Under pytest-xdist (`make test` runs one worker per core) each worker and the commands it starts compute on one
# thread: two workers of two threads each on two cores lose more to contention than they gain.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest
import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, Cohere2Config, CohereConfig, DeepseekV3Config,
                          FalconConfig, Gemma2Config, Gemma3TextConfig, Gemma4TextConfig, GemmaConfig, GptOssConfig,
                          GraniteConfig, LlamaConfig, MistralConfig, MixtralConfig, Olmo2Config, Phi3Config,
                          Qwen2Config, Qwen3Config, Qwen3MoeConfig, SmolLM3Config, StableLmConfig)

torch.set_num_threads(1 if WORKERS > 1 else min(2, torch.get_num_threads()))

# rouge-score imports absl.logging, whose handler keeps the sys.stderr of that moment (under pytest, a capture's
# stream) and closes it when logging's handlers are shut down (Hydra's logging setup, in a run started in-process):
# every later test's capture then writes to a closed file. Its stream is the process's own stderr instead.
import absl.logging  # noqa: E402

from conf.schema import CONF  # noqa: E402

absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__


@pytest.hookimpl(optionalhook=True)        # xdist's hook: without xdist (-p no:xdist) there is none to implement
def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadgroup`, the tests that submit to the one SLURM cluster (their module) are one unit, run one
    after another on one worker: they wait on its two CPUs and read its queue, which another worker's jobs would
    change under them. xdist hands out its largest unit first, so they start at once, beside the rest. (xdist's
    `xdist_group` mark does not group under pytest 9.2.)"""
    from xdist.scheduler import LoadGroupScheduling

    module = Path(__file__).with_name("test_slurm.py").relative_to(config.rootpath).as_posix()

    class SlurmOnOneWorker(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return module if nodeid.startswith(f"{module}::") else super()._split_scope(nodeid)

    return SlurmOnOneWorker(config, log) if config.getvalue("dist") == "loadgroup" else None


def pytest_collection_modifyitems(items):
    """The tests on the real models (`slow`) first, so that the last minutes are short tests spread over both
    workers, not one long test on one."""
    items.sort(key=lambda item: not item.get_closest_marker("slow"))

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)
# Gemma-4's per-layer input embeddings over the tiny vocabulary (its default, 262,144 rows, made a tiny model of 200M
# parameters, 2.3 s to build)
GEMMA4 = dict(COMMON, sliding_window=12, vocab_size_per_layer_input=COMMON["vocab_size"])
LLAMA31_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=32)         # short, so the scaling acts at these lengths
GEMMA3_ROPE = {"sliding_attention": dict(rope_type="default", rope_theta=10000.0),
               "full_attention": dict(rope_type="linear", rope_theta=1000000.0, factor=8.0)}
SLIDING_GLOBAL = ["sliding_attention", "full_attention", "sliding_attention"]
FALCON_KEYS = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings",
               "bos_token_id", "eos_token_id", "pad_token_id"}
FAMILIES = {
    "llama": lambda: LlamaConfig(**COMMON),
    "llama31": lambda: LlamaConfig(**COMMON, rope_parameters=LLAMA31_ROPE),    # RoPE scaling
    "qwen2": lambda: Qwen2Config(**COMMON),                      # projection biases
    "mistral": lambda: MistralConfig(**COMMON, sliding_window=None),
    "mixtral": lambda: MixtralConfig(**COMMON, sliding_window=None, num_local_experts=4, num_experts_per_tok=2),
    "gemma": lambda: GemmaConfig(**COMMON),
    "gemma2": lambda: Gemma2Config(**COMMON, sliding_window=12, query_pre_attn_scalar=16,
                                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    "gemma3": lambda: Gemma3TextConfig(**COMMON, sliding_window=12, query_pre_attn_scalar=16,  # RoPE per layer type
                                       layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                       rope_parameters=GEMMA3_ROPE),
    "gemma4": lambda: Gemma4TextConfig(**GEMMA4, global_head_dim=16,                       # RoPE per tensor,
                                       layer_types=["sliding_attention", "full_attention", "full_attention"]),  # heads 2nd
    "gemma4_wide": lambda: Gemma4TextConfig(**GEMMA4, global_head_dim=32,                     # wider global heads,
                                            attention_k_eq_v=True, layer_types=SLIDING_GLOBAL),  # values from keys
    "qwen3": lambda: Qwen3Config(**COMMON),                      # QK-norm
    "qwen3_moe": lambda: Qwen3MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "phi3": lambda: Phi3Config(**COMMON, partial_rotary_factor=0.5),         # fused qkv, partial rotary inside RoPE
    "olmo2": lambda: Olmo2Config(**COMMON),                      # norm over all heads' keys before the split
    "granite": lambda: GraniteConfig(**COMMON, attention_multiplier=0.2, embedding_multiplier=2.0,
                                     residual_multiplier=0.5, logits_scaling=4.0),
    "stablelm": lambda: StableLmConfig(**COMMON, partial_rotary_factor=0.25, use_qkv_bias=True),  # rotary outside RoPE
    "cohere": lambda: CohereConfig(**COMMON, logit_scale=0.5),   # interleaved rotary halves
    "gpt_oss": lambda: GptOssConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=12,
                                    layer_types=SLIDING_GLOBAL),                 # learned attention sinks
    "smollm3": lambda: SmolLM3Config(**COMMON, no_rope_layers=[1, 0, 1]),      # a layer without rotary positions
    "cohere2": lambda: Cohere2Config(**COMMON, sliding_window=12, layer_types=SLIDING_GLOBAL),  # global: no rotary
    "falcon": lambda: FalconConfig(**{k: v for k, v in COMMON.items() if k in FALCON_KEYS},    # .h, inline attention
                                   new_decoder_architecture=True, num_kv_heads=2),
    "deepseek_v3": lambda: DeepseekV3Config(**{**COMMON, "head_dim": 8, "num_key_value_heads": 4},  # multi-head latent
                                            kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,      # attention: a
                                            qk_nope_head_dim=8, v_head_dim=12, n_routed_experts=4,      # latent and a
                                            num_experts_per_tok=2, first_k_dense_replace=1,             # rotated part
                                            moe_intermediate_size=32, n_group=1, topk_group=1),         # are cached
}


class CharTokenizer:
    """A deterministic tokenizer over characters, with bos=1 and eos=2, and no chat template."""

    bos_token_id, eos_token_id, chat_template = 1, 2, None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([1] if add_special_tokens else []) + [3 + ord(c) % 120 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + (i - 3) % 26) for i in ids if i > 2)


def tiny_model(family: str, **config):
    """The family's tiny random model, seeded; `config` overrides its config's fields (e.g. a longer window)."""
    torch.manual_seed(0)
    settings = FAMILIES[family]()
    for name, value in config.items():
        setattr(settings, name, value)
    model = AutoModelForCausalLM.from_config(settings).eval()
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


NO_TENSORS = (2).to_bytes(8, "little") + b"{}"   # a whole .safetensors file holding no tensor: weights never read


FRAGMENTS = ["the cat sat on the mat", "a quick brown fox jumps", "hello world again and again", "zzz yy x",
             "a much longer fragment that crosses the sliding window of twelve"]


@pytest.fixture(scope="session")
def smollm2():
    from harness.models.loading import ModelSpec, load
    return load(ModelSpec("smollm2", "smollm2"))


def save_tiny_checkpoint(folder) -> str:
    """A loadable checkpoint folder: a tiny random Llama and a byte-level BPE tokenizer with a chat
    template, trained offline on the synthetic set, so whole runs go through the real harness."""
    from harness.running.families import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(**{**COMMON, "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
                            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
                            "max_position_embeddings": 8192})
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"))


def save_tiny_memoryllm(folder, tokenizer_folder: str, **extra) -> str:
    """A tiny random MemoryLLM (a pool of 8 x 16 slots, LoRA adapters, a drop per layer; `extra` config fields
    make it an M+) on the tiny checkpoint's tokenizer: whole runs of its methods (plumbing, not accuracy)."""
    from methods.memoryllm.checkpoint import MemoryLLMConfig, MemoryLLMForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    torch.manual_seed(0)
    config = MemoryLLMConfig(**{**COMMON, "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
                                "eos_token_id": tokenizer.eos_token_id, "max_position_embeddings": 8192},
                             num_tokens=16, num_blocks=8, drop_memory_per_layer=True, add_decoder_lora=True,
                             lora_config={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}, **extra)
    model = MemoryLLMForCausalLM(config)
    for name, parameter in model.named_parameters():
        if name.startswith("ltm"):                         # a long-term memory to retrieve from
            parameter.data.copy_(torch.rand_like(parameter) * (5 if "frequencies" in name else 1))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_memoryllm(tmp_path_factory, tiny_checkpoint):
    return save_tiny_memoryllm(tmp_path_factory.mktemp("tiny_memoryllm"), tiny_checkpoint)


@pytest.fixture(scope="session")
def tiny_mplus(tmp_path_factory, tiny_checkpoint):
    """... with M+'s long-term memory: 2 of its 8 blocks retrieved, the cache joining every 2 injections."""
    return save_tiny_memoryllm(tmp_path_factory.mktemp("tiny_mplus"), tiny_checkpoint, num_ltm_blocks=2,
                               ltm_initial_size=40, update_ltm_frequency=2, initial_rf_when_moving_stm_to_ltm=10,
                               add_selector=True, selector_hidden_dim=8, num_selector_layers=2)


def tiny_overrides(checkpoint: str, small_task: bool = True) -> list[str]:
    """The overrides that put a run on the tiny checkpoint; small_task: 4 groups of 3 updates."""
    base = [f"model.source={checkpoint}", "model.name=tiny_llama", "model.tracer_layer=1",
            "model.memory_capacity=300", "model.device_map=null", "model.dtype=float32",
            "model.query_mode=mean", "logger=none", "max_new_tokens=4"]
    return base + (["task.groups=4", "task.updates=3"] if small_task else [])


def tiny_run_config(checkpoint: str, *overrides: str, small_task: bool = True):
    """The harness config of a run on the tiny checkpoint: tiny_overrides, then `overrides`."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("conf", version_base="1.3"):
        return compose("config", overrides=tiny_overrides(checkpoint, small_task) + list(overrides))


EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


@functools.lru_cache(maxsize=None)
def sweep_axes(experiment: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """An experiment's sweep axes, (key, values) each, composed once per process (a composition takes about a
    second, and several tests of a worker sweep the same experiment)."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("conf", version_base="1.3"):
        sweep = compose("config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    return tuple((key, tuple(str(values).split(","))) for key, values in sweep.hydra.sweeper.params.items())


def sweep_points(experiment: str, keep_first: tuple[str, ...] = ()) -> list[list[str]]:
    """The override lists of every run in an experiment's multirun; keys in `keep_first` keep only their
    first value (a model axis, when the tiny checkpoint stands in for every model)."""
    params = {key: values[:1 if key in keep_first else None] for key, values in sweep_axes(experiment)}
    assert params, f"experiment {experiment} sweeps nothing"
    return [[f"{k}={v}" for k, v in zip(params, values)] for values in itertools.product(*params.values())]


REGRESSION = Path(__file__).resolve().parent / "testdata" / "regression"
REGENERATE = os.environ.get("MEMDEFRAG_REGENERATE") == "1"
# what differs between machines and checkouts without changing an answer: the checkpoint's and data's paths
NOT_ANSWERS = ("model.source", "task.data_dir")


def matches_cached(run_dir: Path, name: str) -> None:
    """The run in `run_dir` answers exactly as its cached copy tests/testdata/regression/<name> (through the
    code of `memdefrag compare`: text equal, numbers within 1e-6, timings never compared); with
    MEMDEFRAG_REGENERATE=1 the run becomes the cached copy (`make regression-cache`; review its diff)."""
    from harness.report.compare import Tolerance, compare_runs, config_key, markdown
    from harness.results.folder import read_jsonl

    cached = REGRESSION / name
    if REGENERATE:
        if cached.exists():
            shutil.rmtree(cached)
        cached.mkdir(parents=True)
        shutil.copy(run_dir / "config.yaml", cached / "config.yaml")
        shutil.copy(run_dir / "metrics.csv", cached / "metrics.csv")
        (cached / "predictions.jsonl").write_text("".join(
            json.dumps({k: v for k, v in r.items() if k != "seconds"}) + "\n"
            for r in read_jsonl(run_dir / "predictions.jsonl")))
        return
    assert cached.is_dir(), f"no cached run {cached}: make regression-cache"
    assert config_key(run_dir, NOT_ANSWERS) == config_key(cached, NOT_ANSWERS), \
        f"{name}: the run's config is not the cached one's (make regression-cache if that is meant)"
    report = compare_runs(name, cached, Path(run_dir), Tolerance())
    assert report.equal, "answers moved against the cached run (A: cached, B: this run):\n" + markdown([report], [])


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if any model weights load; records every job that starts."""
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    from harness import cli

    started = []
    monkeypatch.setattr(cli, "run", lambda *a, **k: started.append(a))
    return started


def as_in_a_terminal() -> None:
    """A terminal's foreground job takes Ctrl-C: SIGINT as its default, whatever the test runner was started with
    (a shell's background job, `make test &`, ignores it, and its children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def console_script(command: str):
    """The entry point an installed console script runs (pyproject's [project.scripts])."""
    scripts = entry_points(group="console_scripts", name=command)
    assert len(scripts) == 1, f"{command} is not installed: make setup (pip install -e .)"
    return next(iter(scripts)).load()


def command(argv, monkeypatch, capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the command `argv` (a console script, then its arguments) run in this
    process: its entry point as the installed script calls it, without a process's imports (6 s here)."""
    monkeypatch.setattr(sys, "argv", [str(a) for a in argv])
    try:
        console_script(argv[0])()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    out, err = capsys.readouterr()
    return code, out, err


def refusal(argv, monkeypatch, capsys) -> str:
    """What the command `argv` (a console script, then its arguments), run in this process, printed to stderr as
    it exited with status 2."""
    code, _, err = command(argv, monkeypatch, capsys)
    assert code == 2, err[-2000:]
    return err


def refused(argv, monkeypatch, capsys) -> str:
    """The one line `memdefrag argv` printed as it exited with status 2."""
    lines = refusal(["memdefrag", *argv], monkeypatch, capsys).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memdefrag: error: "), lines
    return lines[0]
