"""Every causal-LM type of the installed transformers, built tiny from its own config class and taken where a
user's model goes: the checks before weights, the load, the fast backend's probe and its self-check. Each ends
exact, refused in one line (naming the type and the reason), or not built: transformers itself cannot build or
run the tiny config, said with its error. New releases then show up as rows, not as users' tracebacks.

`python -m harness.running.families --out results/families.md` writes the table the README's family statement quotes.
"""

from __future__ import annotations

import copy
import functools
import re
import shutil
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch
import transformers
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from harness.errors import ConfigError

Outcome = StrEnum("Outcome", ["exact", "refused_before_weights", "refused_at_load", "refused_by_self_check",
                              "not_built"])
TINY_PARAMETERS = 15_000_000       # a shrunk config above this kept a size no rule below reached: not built
LAYERS = (2, 4, 8)                 # tried in turn: a hybrid's first layers may hold no attention layer
VOCAB = 400
SIZES = {                          # attribute -> its tiny value (where the config has it, or an alias of it)
    "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}
CAPS = [                           # every other integer size, by the pattern of its name: (pattern, at most)
    (r"vocab", VOCAB), (r"expert.*(num|per_tok)|(num|n)_.*experts|top_?k", 4),
    (r"rank", 16), (r"head_dim|dim_head", 16), (r"heads", 4), (r"layers?$", 2),
    (r"intermediate|ffn|dim_ff|d_ff|inner", 96), (r"window|chunk|block", 16),
    (r"_size$|_dim$|width|embed", 64),
]
ADJUST = {   # model type: settings where shrinking alone is invalid, each with its reason
    # multi-head latent attention: the rotated and unrotated parts of a head and the value width are separate
    # sizes, and its cache holds as many key/value heads as query heads
    **{kind: dict(num_key_value_heads=4, head_dim=8, qk_rope_head_dim=8, qk_nope_head_dim=8, qk_head_dim=16, v_head_dim=12,
                  kv_lora_rank=16, q_lora_rank=16)
       for kind in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa", "youtu",
                    "sarvam_mla", "axk1", "axk2", "hy_v4", "longcat_flash", "kimi_linear", "bailing_hybrid")},
    "minicpm3": dict(num_key_value_heads=4, head_dim=8, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, kv_lora_rank=16,
                     q_lora_rank=16),       # latent attention as above
    "gptj": dict(rotary_dim=8),            # its rotary part must fit in a 16-wide head
    "codegen": dict(rotary_dim=8),
    "plbart": dict(encoder_attention_heads=4, decoder_attention_heads=4),   # heads must divide the width
    "whisper": dict(encoder_attention_heads=4, decoder_attention_heads=4),
    "reformer": dict(is_decoder=True, axial_pos_shape=[16, 32], axial_pos_embds_dim=[32, 32]),  # a decoder;
                                           # its axial position sizes must sum to the width
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]]),   # its layer pattern names the layer count
    "hrm_text": dict(num_layers_per_stack=1, H_cycles=1, L_cycles=1),   # its layers: stack x H x (L + 1) cycles
}


@dataclass
class Row:
    model_type: str
    outcome: Outcome
    detail: str = ""               # the one line a user sees, or transformers' own error
    seconds: float = 0.0


def causal_types() -> list[str]:
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str, layers: int = 2):
    """The type's own config class at its defaults, it and each of its sub-configs (a multimodal one's text and
    vision parts) shrunk to `layers` layers, then the type's ADJUST."""
    config = CONFIG_MAPPING[model_type]()
    for part in [config, *(value for value in vars(config).values() if isinstance(value, PretrainedConfig))]:
        shrunk(part, layers, ADJUST.get(model_type, {}))
    return config


def shrunk(config, layers: int, adjust: dict) -> None:
    """Every size of `config` made tiny (SIZES, then CAPS by name, then `adjust`); every per-layer list cut to
    `layers`. A setting the config will not take (a derived property) follows the others."""
    before = getattr(config, "num_hidden_layers", None)
    caps = {key: min(value, cap) for key, value in config.to_dict().items()
            if isinstance(value, int) and not isinstance(value, bool) and not key.endswith("token_id")
            for cap in [next((c for pattern, c in CAPS if re.search(pattern, key)), None)] if cap is not None}
    per_layer = {key: value[:layers] for key, value in vars(config).items()
                 if isinstance(value, list) and before and len(value) == before}
    for key, value in {**caps, **SIZES, "num_hidden_layers": layers, **per_layer, **adjust}.items():
        if hasattr(config, key):
            try:
                setattr(config, key, value)
            except (AttributeError, TypeError, ValueError, NotImplementedError):
                pass


def tiny_tokenizer():
    """A byte-level BPE tokenizer of VOCAB ids (pad 0, bos 1, eos 2) with a chat template, trained offline on
    the synthetic set: what a tiny checkpoint ships beside its weights."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from evals.synthetic import generate

    data = generate(0)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([t.context for t in data.targets[:200]] + list(data.unrelated[:50]), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tokenizer.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
                               "{% if add_generation_prompt %}<s>assistant: {% endif %}")
    return tokenizer


def built(model_type: str, folder: Path, tokenizer) -> str | None:
    """Save the tiny random model of `model_type` and `tokenizer` into `folder`; transformers' own error in one
    line where it cannot build, run or save it (None when it can)."""
    for layers in LAYERS:
        try:
            config = tiny_config(model_type, layers)
            with torch.device("meta"):
                size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
            if size > TINY_PARAMETERS:
                return f"shrunk, it still has {size:,} parameters: a size no rule of harness/running/families.py reaches"
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config).eval()
            with torch.no_grad():
                model(input_ids=torch.tensor([[1, 5, 6, 7, 8, 9]], device=model.device))
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            return None
        except Exception as err:  # noqa: BLE001 - transformers' own failure on its own tiny config, said as such
            failure = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"
    return failure


@functools.cache
def _run_config():
    """The run every type is judged by (composed once: composing costs more than judging a tiny model)."""
    from hydra import compose, initialize_config_module

    overrides = ["model=hf", "model.source=tiny", "model.tracer_layer=1", "model.query_mode=mean",
                 "model.dtype=float32", "model.device=cpu", "method=memdefrag_top2", "task.groups=1",
                 "task.updates=2", "logger=none", "max_new_tokens=4"]
    with initialize_config_module("conf", version_base="1.3"):
        return compose("config", overrides=overrides)


def judged(model_type: str, folder: Path) -> tuple[Outcome, str]:
    """What a run of the tiny checkpoint in `folder` meets: the checks before weights, then the load, probe and
    self-check of backend=fast. Anything but a ConfigError escapes: a traceback a user would see."""
    from harness.running.runner import preflight, ready

    cfg = copy.deepcopy(_run_config())
    cfg.model.source, cfg.model.name = str(folder), model_type
    try:
        spec = preflight(cfg)[0]
    except ConfigError as err:
        return Outcome.refused_before_weights, str(err)
    try:
        ready(spec, "fast")
    except ConfigError as err:
        self_check = "does not reproduce the paper's formulation" in str(err)
        return (Outcome.refused_by_self_check if self_check else Outcome.refused_at_load), str(err)
    return Outcome.exact, ""


def survey(types: list[str] | None = None, tokenizer=None) -> list[Row]:
    """One Row per causal-LM type (all of them by default), each built and judged in a temporary folder."""
    tokenizer = tokenizer or tiny_tokenizer()
    rows = []
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_type in types or causal_types():
            start, folder = time.perf_counter(), Path(scratch) / model_type
            failure = built(model_type, folder, tokenizer)
            outcome, detail = (Outcome.not_built, failure) if failure else judged(model_type, folder)
            rows.append(Row(model_type, outcome, detail.replace(str(folder), "<tiny checkpoint>"),
                            time.perf_counter() - start))
            shutil.rmtree(folder, ignore_errors=True)
    return rows


def markdown(rows: list[Row], seconds: float) -> str:
    counts = Counter(row.outcome for row in rows)
    lines = [f"# Every causal-LM type of transformers {transformers.__version__} (torch {torch.__version__})",
             "", "Generated by `python -m harness.running.families --out results/families.md` "
             f"({len(rows)} types, {seconds:.0f} s on this machine); each type built tiny from its own config "
             "class (harness/running/families.py) and run as `memdefrag model=hf model.source=<it> "
             "method=memdefrag_top2` would run it.", "",
             "| outcome | types |", "|---|---|",
             *[f"| {outcome} | {counts.get(outcome, 0)} |" for outcome in Outcome], "",
             "| model type | outcome | the line a user sees (or transformers' own error) |", "|---|---|---|",
             *[f"| {row.model_type} | {row.outcome} | {row.detail.replace('|', '/')} |" for row in rows]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from harness.errors import OneLineParser

    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="a Markdown file for the table (default: print it)")
    parser.add_argument("types", nargs="*", help="model types (default: every causal-LM type)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    text = markdown(survey(args.types or None), time.perf_counter() - start)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
