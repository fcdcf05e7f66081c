"""The load-time self-check: the fast backend must answer as the paper's formulation does.

The fast backend re-places stored keys with the positions it learned from the model (see
methods.attention.positions). The first time a model is used with it (per model, dtype and device), two
short fragments are stored, put in reversed order and asked about. The truth both backends approximate is
the paper's hidden-prefix formulation computed in float32 (the weights upcast in place for the check, and
restored exactly). In float32 the fast backend must match it within a float32 rounding tolerance. In a
lower precision both formulations carry that precision's own rounding, which grows with depth (a 32-layer
bf16 model is off by tenths of a logit), so a fixed tolerance refuses exact code: there the fast backend
must come as close to the truth as the hidden-prefix formulation run in the same dtype does, within MARGIN,
in logits and in every layer's densities, and give the truth's greedy answer wherever that formulation
does, unless it leaves it at a near tie of the truth's two largest logits (see `judged`). A real error (a
position off by one, a wrong rotary base) moves the fast backend far past that bound. A mismatch stops the run
with one clear error. The verdict is cached (MEMDEFRAG_CACHE/selfcheck/), so it
costs seconds once.
"""

from __future__ import annotations

import hashlib
import sys
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import torch
import transformers

import methods
from harness.models.cache import read_json, usable, write_json
from harness.errors import ConfigError, OneLineParser, stops_on_config_error
from harness.models.loading import ModelSpec
from methods.formation import Former
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.generation import greedy, stop_ids
from methods.memory import LatentMemory
from methods.attention.decoder import DecoderError
from methods.attention.positions import RotaryError
from methods.backends.support import UNSUPPORTED, way_out
from methods.prompting import format_prompt
from methods.attention.tracing import QueryMode, densities

FRAGMENTS = ("The lighthouse keeper of Port Alder is Mirela Voss, who paints gulls at dawn.",
             "Copper melts at 1085 degrees Celsius and conducts heat well.")
QUESTION = "Who keeps the lighthouse of Port Alder?"
# float32's rounding: the largest allowed difference from the truth, relative to the largest |logit|
# (densities: to the largest density); every dtype is allowed at least this
FLOAT32_TOLERANCE = 1e-4
# in a lower precision, the fast backend may be off the truth by at most MARGIN times what the hidden-prefix
# formulation in that precision is: on random 32-layer Llamas (10 seeds, bf16 and fp16) the fast backend's error
# was 0.93-1.17x the reference's in logits and 0.43-1.37x in densities; a position off by one put it 7-126x
# (logits) and 3.7-102x (densities) past it, a wrong rotary base 20-224x and 14-434x (tests/test_selfcheck.py)
MARGIN = 2.0
VERDICT_KEYS = {"exact", "model_type", "dtype", "truth", "fast_logits_error", "fast_density_error", "tie_gap"}


def refuse_unsupported(backend_class, model_config) -> None:
    """Before any weights load: what the backend cannot run (its own `check`), with the way out (way_out)."""
    try:
        backend_class.check(model_config)
    except UNSUPPORTED as err:
        raise ConfigError(f"backend={backend_class.name} {err}: {way_out(backend_class, model_config)}") from None


@dataclass
class Outcome:
    """What one formulation gives: the prompt's logits [p, vocab], every layer's densities in both query modes
    [2L, fragments] (fp32, on the host), its greedy answer's ids, the memory it read (sink included), and at each
    step of its answer and the one after, the gap between its two largest logits [len(answer) + 1]."""

    logits: torch.Tensor
    densities: torch.Tensor
    answer: list[int]
    memory_tokens: int
    gaps: torch.Tensor


@contextmanager
def in_float32(model):
    """The model's floating weights and buffers in float32 for the duration, each cast back to its own dtype
    after: lossless both ways (bf16 and fp16 values are float32 values). The check's memory then holds the
    weights once, at 4 bytes per parameter."""
    lowered = [(tensor, tensor.dtype) for tensor in chain(model.parameters(), model.buffers())
               if tensor.is_floating_point() and tensor.dtype != torch.float32]
    for tensor, _ in lowered:
        tensor.data = tensor.data.float()
    try:
        yield
    finally:
        for tensor, dtype in lowered:
            tensor.data = tensor.data.to(dtype)


@torch.no_grad()
def outcomes(model, tokenizer, backend_classes, texts, order, question, prompt, answer_tokens) -> list[Outcome]:
    """Each backend's Outcome on `texts` stored in turn (formed in the model's current dtype), arranged in
    `order`."""
    former = Former(model, tokenizer, "shared_sink", keep_kv=True, keep_states=True)
    memory = LatentMemory()
    for text in texts:
        former.store(memory, text)
    view, prompt_ids = memory.arranged(list(order)), format_prompt(tokenizer, question, prompt)
    stop, layers = stop_ids(model, tokenizer), list(range(model.config.get_text_config().num_hidden_layers))
    found = []
    for backend in (backend_class(model) for backend_class in backend_classes):
        logits, cache, position = backend.prefill(view, prompt_ids)
        answer = greedy(model, logits, cache, position, answer_tokens, stop)
        rows = backend.attention_rows(view, prompt_ids, layers)
        dens = torch.stack([densities(rows[layer], view.spans(), mode) for layer in layers for mode in QueryMode])
        steps = backend.prefill(view, torch.cat([prompt_ids, prompt_ids.new_tensor(answer)]),
                                logits_to_keep=len(answer) + 1)[0].float().topk(2).values
        found.append(Outcome(logits.float().cpu(), dens.float().cpu(), answer, view.prefix_length,
                             (steps[:, 0] - steps[:, 1]).cpu()))
    return found


def tie_gap(fast: Outcome, truth: Outcome) -> float | None:
    """Where the fast answer leaves the truth's (None: it does not), the truth's gap between its two largest
    logits at that step: their prefixes are the same up to it, so it is the same context."""
    if fast.answer == truth.answer:
        return None
    pairs = list(zip(fast.answer, truth.answer))
    return float(truth.gaps[next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs))])


def compared(model, tokenizer, *args) -> dict:
    """compare(), a model the fast backend turns out not to hold once loaded (a rotation its keys cannot be traced
    to, RotaryError) refused in one line, with the way out (way_out)."""
    try:
        return compare(model, tokenizer, *args)
    except RotaryError as err:
        raise ConfigError(f"backend=fast: {err}: {way_out(KVPrefixBackend, model.config)}") from None


@torch.no_grad()
def compare(model, tokenizer, texts=FRAGMENTS, order=(1, 0), question=QUESTION, prompt="plain",
            answer_tokens: int = 4) -> dict:
    """Both backends in the model's dtype on `texts` stored in turn, then arranged in `order` (reversed by
    default), each against the truth (the hidden-prefix formulation in float32): the largest logit and
    density errors, whether each gives the truth's greedy answer of `answer_tokens`, and the truth's scales."""
    args = (texts, order, question, prompt, answer_tokens)
    fast, reference = outcomes(model, tokenizer, (KVPrefixBackend, HiddenPrefixBackend), *args)
    truth = reference
    if model.dtype != torch.float32:
        with in_float32(model):
            truth, = outcomes(model, tokenizer, (HiddenPrefixBackend,), *args)
    found = {"memory_tokens": truth.memory_tokens, "truth": "hidden_prefix in float32",
             "logits_scale": float(truth.logits.abs().max()), "density_scale": float(truth.densities.abs().max()),
             "tie_gap": tie_gap(fast, truth)}
    for name, outcome in (("fast", fast), ("reference", reference)):
        found |= {f"{name}_logits_error": float((outcome.logits - truth.logits).abs().max()),
                  f"{name}_density_error": float((outcome.densities - truth.densities).abs().max()),
                  f"{name}_answer_as_truth": outcome.answer == truth.answer}
    return found


def judged(found: dict) -> dict:
    """The verdict on `compare`'s findings: the bounds the fast backend's errors were held to, and whether it
    is exact: within them, and the truth's greedy answer wherever the reference in the same dtype gives it, unless
    it leaves the truth's answer at a near tie. A near tie: the truth's two largest logits closer than twice the
    logits bound, so that two logits each off by no more than the bound may swap (random 8B weights, init 0.02:
    of 128k logits the top two often lie closer than bf16's error, and a GPU's fast path rounds otherwise than
    its reference; tests/test_selfcheck.py)."""
    bounds = {kind: MARGIN * found[f"reference_{kind}_error"] + FLOAT32_TOLERANCE * max(floor, found[f"{kind}_scale"])
              for kind, floor in (("logits", 1.0), ("density", 1e-6))}
    near_tie = found["tie_gap"] is not None and found["tie_gap"] <= 2 * bounds["logits"]
    exact = all(found[f"fast_{kind}_error"] <= bound for kind, bound in bounds.items()) and (
        found["fast_answer_as_truth"] or not found["reference_answer_as_truth"] or near_tie)
    return {**found, "logits_bound": bounds["logits"], "density_bound": bounds["density"], "margin": MARGIN,
            "float32_tolerance": FLOAT32_TOLERANCE, "exact": exact}


def _verdict_file(model, spec: ModelSpec):
    """Where the verdict for this model, dtype, device and code is kept (the code: the libraries' versions and
    the source of methods/ and of this check, so an edited backend or criterion is checked anew)."""
    code = [*sorted(Path(methods.__path__[0]).rglob("*.py")), Path(__file__)]
    source = hashlib.sha256(b"".join(path.read_bytes() for path in code)).hexdigest()
    identity = json.dumps([spec.source, spec.gguf_file, getattr(model, "name_or_path", ""), str(model.dtype),
                           model.device.type, model.config.to_json_string(), transformers.__version__,
                           torch.__version__, source], sort_keys=True)
    return usable("selfcheck") / f"{hashlib.sha256(identity.encode()).hexdigest()[:20]}.json"


def verify(backend, tokenizer, spec: ModelSpec) -> dict | None:
    """The fast backend's verdict for this model (cached), or a ConfigError when it is not exact.
    The reference backend needs none (None)."""
    if not isinstance(backend, KVPrefixBackend):
        return None
    model = backend.model
    path = _verdict_file(model, spec)
    verdict = read_json(path)                      # a verdict file cut short is checked anew
    if not VERDICT_KEYS <= verdict.keys():
        start = time.perf_counter()
        found = compared(model, tokenizer)
        verdict = {**judged(found), "seconds": time.perf_counter() - start, "model_type": model.config.model_type,
                   "dtype": str(model.dtype).removeprefix("torch.")}
        write_json(path, verdict)
    if not verdict["exact"]:
        raise ConfigError(
            f"backend=fast does not reproduce the paper's formulation on model type {verdict['model_type']!r} "
            f"({verdict['dtype']}): against the hidden-prefix formulation in float32, its logits are off by "
            f"{verdict['fast_logits_error']:.3g} (allowed {verdict['logits_bound']:.3g}), its densities by "
            f"{verdict['fast_density_error']:.3g} (allowed {verdict['density_bound']:.3g})"
            f"{'' if verdict['fast_answer_as_truth'] else ', its greedy answer differs'} "
            f"(self-check, {path}); {way_out(KVPrefixBackend, model.config)}")
    return verdict


def main(argv: list[str] | None = None) -> None:
    """`python -m harness.models.selfcheck --model gemma3_270m`: both backends against the truth on one group's fragments
    of a retention set, stored in order (vanilla) and as a reordered Top-2 view, with the verdict each would get;
    `--shape llama31_8b --dtype bfloat16 --device cuda`: a random model of a real shape instead."""
    import pandas as pd

    from evals.retention import Retention
    from harness.models.shapes import SHAPES, build
    from harness.models.loading import DTYPES, check_source, load

    parser = OneLineParser(prog="python -m harness.models.selfcheck", description=main.__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a config in conf/model/")
    parser.add_argument("--source", default=None, help="the model's weights (model.source): a hub id, a folder or "
                                                       "a .gguf file; with --model hf, required")
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES), help="a random model of this shape")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: the model config's")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder for --shape (default: SmolLM2's)")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--fragments", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="also write the table as Markdown here")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: must be >= 1")
    if args.shape and args.source:
        parser.error(f"--source {args.source}: a --shape is a random model; give --model hf --source instead")
    torch.set_num_threads(args.threads)
    if args.shape:
        model, tokenizer, _, _ = build(args.shape, args.device, args.dtype or "float32", args.tokenizer)
        name, prompt = args.shape, "chat"
    else:
        from hydra import compose, initialize_config_module
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        overrides = [f"model={args.model}", f"model.device={args.device}"] + \
            ([f"model.dtype={args.dtype}"] if args.dtype else [])
        with initialize_config_module("conf", version_base="1.3"):
            try:
                model = compose("config", overrides=overrides).model
                if args.source:                  # set, not an override: a path may hold what Hydra would parse
                    model.source = args.source
                spec = ModelSpec.of(model)
            except (HydraException, OmegaConfBaseException) as err:
                parser.error(f"--model {args.model}{f' --source {args.source}' if args.source else ''}: "
                             f"{str(err).splitlines()[0]} (--model names a file in conf/model/; --model hf takes "
                             f"its weights from --source)")
        model_config = check_source(spec)[0]
        for backend_class in (KVPrefixBackend, HiddenPrefixBackend):   # the two it compares, refused before load
            refuse_unsupported(backend_class, model_config)
        model, tokenizer = load(spec)
        name, prompt = args.model, spec.prompt
    group = Retention(args.dataset, args.data_dir, groups=1, updates=args.fragments).groups(tokenizer)[0]
    texts = group.texts()
    n = len(texts)
    rows = []
    for view, order in (("vanilla", range(n)), ("reordered Top-2", (n - 1, 0))):
        start = time.perf_counter()
        try:
            found = judged(compared(model, tokenizer, texts, tuple(order), group.target.question, prompt, 16))
        except DecoderError as err:           # a layer neither formulation can read (its attention, its inputs)
            raise ConfigError(f"{err}: the self-check cannot judge this model") from None
        rows.append({"model": name, "dtype": str(model.dtype).removeprefix("torch."), "view": view,
                     "fragments": len(order), **found, "seconds": round(time.perf_counter() - start, 1)})
    table = pd.DataFrame(rows).drop(columns=["truth", "margin", "float32_tolerance"]).to_markdown(
        index=False, floatfmt=".3g")
    print(table)
    if args.out:
        command = " ".join(["python -m harness.models.selfcheck", *(sys.argv[1:] if argv is None else argv)])
        Path(args.out).write_text(f"`{command}` (device {model.device}, {torch.get_num_threads()} threads; truth: "
                                  f"the hidden-prefix formulation in float32, margin {MARGIN})\n\n{table}\n")


if __name__ == "__main__":
    with stops_on_config_error("python -m harness.models.selfcheck"):
        main()
