"""The load-time self-check: the fast backend must answer as the paper's formulation does.

The fast backend re-places stored keys with the positions it learned from the model (see
methods.attention.positions). The first time a model is used with it (per model, dtype and device), two
short fragments are stored, put in reversed order and asked about by both backends; the prompt's
logits and every layer's densities must agree within the dtype's tolerance. A mismatch stops the
run with one clear error. The verdict is cached (MEMDEFRAG_CACHE/selfcheck/), so it costs seconds once.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
import transformers

import methods
from harness.cache import read_json, usable, write_json
from harness.errors import ConfigError, OneLineParser
from harness.models import ModelSpec
from methods.formation import Former
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.generation import greedy, stop_ids
from methods.memory import LatentMemory
from methods.attention.positions import RotaryError
from methods.session import format_prompt
from methods.attention.tracing import densities

FRAGMENTS = ("The lighthouse keeper of Port Alder is Mirela Voss, who paints gulls at dawn.",
             "Copper melts at 1085 degrees Celsius and conducts heat well.")
QUESTION = "Who keeps the lighthouse of Port Alder?"
# largest allowed difference, relative to the largest |logit| (densities: to the largest density)
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
FALLBACK = "use backend=hidden_prefix (the paper's formulation, slower) for this model"


def refuse_unsupported(backend_class, model_config) -> None:
    """Before any weights load: what the backend cannot run (the fast one: a family without rotary positions)."""
    try:
        backend_class.check(model_config)
    except RotaryError as err:
        raise ConfigError(f"backend={backend_class.name} {err}: {FALLBACK}") from None


@torch.no_grad()
def compare(model, tokenizer, texts=FRAGMENTS, order=(1, 0), question=QUESTION, prompt="plain",
            answer_tokens: int = 4) -> dict:
    """Both backends on `texts` stored in turn, then arranged in `order` (reversed by default): the
    largest logit and density differences, and whether greedy answers of `answer_tokens` agree."""
    former = Former(model, tokenizer, "shared_sink", keep_kv=True, keep_states=True)
    memory = LatentMemory()
    for text in texts:
        former.store(memory, text)
    view, prompt_ids = memory.arranged(list(order)), format_prompt(tokenizer, question, prompt)
    backends = KVPrefixBackend(model), HiddenPrefixBackend(model)
    prefilled = [b.prefill(view, prompt_ids) for b in backends]                 # (logits, cache, position)
    fast_logits, reference_logits = (logits for logits, _, _ in prefilled)
    stop = stop_ids(model, tokenizer)
    answers = [greedy(model, *state, answer_tokens, stop) for state in prefilled]
    layers = list(range(model.config.get_text_config().num_hidden_layers))
    fast_rows, reference_rows = (b.attention_rows(view, prompt_ids, layers) for b in backends)
    density_diff, density_scale = 0.0, 0.0
    for layer in layers:
        for mode in ("last", "mean"):
            a, b = (densities(rows[layer], view.spans(), mode) for rows in (fast_rows, reference_rows))
            density_diff = max(density_diff, float((a - b).abs().max()))
            density_scale = max(density_scale, float(b.abs().max()))
    return {"memory_tokens": 1 + view.n_tokens,
            "logits_max_diff": float((fast_logits.float() - reference_logits.float()).abs().max()),
            "logits_scale": float(reference_logits.float().abs().max()),
            "density_max_diff": density_diff, "density_scale": density_scale,
            "same_greedy_answer": answers[0] == answers[1]}


def _verdict_file(model, spec: ModelSpec):
    """Where the verdict for this model, dtype, device and code is kept (the code: the libraries' versions and
    the source of methods/, so an edited backend is checked anew)."""
    code = sorted(Path(methods.__path__[0]).rglob("*.py"))
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
    if not {"exact", "model_type", "dtype", "logits_max_diff", "density_max_diff"} <= verdict.keys():
        start = time.perf_counter()
        try:
            found = compare(model, tokenizer)
        except RotaryError as err:
            raise ConfigError(f"backend=fast: {err}: {FALLBACK}") from None
        tolerance = TOLERANCE.get(model.dtype, TOLERANCE[torch.bfloat16])
        exact = found["same_greedy_answer"] and (found["logits_max_diff"] <= tolerance * max(1.0, found["logits_scale"])
                 and found["density_max_diff"] <= tolerance * max(1e-6, found["density_scale"]))
        verdict = {**found, "tolerance": tolerance, "exact": exact, "seconds": time.perf_counter() - start,
                   "model_type": model.config.model_type, "dtype": str(model.dtype).removeprefix("torch.")}
        write_json(path, verdict)
    if not verdict["exact"]:
        raise ConfigError(
            f"backend=fast does not reproduce the paper's formulation on model type {verdict['model_type']!r} "
            f"({verdict['dtype']}): logits differ by {verdict['logits_max_diff']:.3g}, densities by "
            f"{verdict['density_max_diff']:.3g} (self-check, {path}); {FALLBACK}")
    return verdict


def main(argv: list[str] | None = None) -> None:
    """`python -m harness.selfcheck --model gemma3_270m`: both backends on one group's fragments of a
    retention set, stored in order (vanilla) and as a reordered Top-2 view."""
    import pandas as pd

    from evals.retention import Retention

    parser = OneLineParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a config in conf/model/")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--fragments", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="also write the table as Markdown here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from hydra import compose, initialize_config_module

    from harness.models import load
    with initialize_config_module("conf", version_base="1.3"):
        spec = ModelSpec.of(compose("config", overrides=[f"model={args.model}"]).model)
    model, tokenizer = load(spec)
    group = Retention(args.dataset, args.data_dir, groups=1, updates=args.fragments).groups(tokenizer)[0]
    texts = group.texts()
    n = len(texts)
    rows = []
    for view, order in (("vanilla", range(n)), ("reordered Top-2", (n - 1, 0))):
        start = time.perf_counter()
        found = compare(model, tokenizer, texts, tuple(order), group.target.question, spec.prompt, 16)
        rows.append({"model": args.model, "view": view, "fragments": len(order), **found,
                     "seconds": round(time.perf_counter() - start, 1)})
    table = pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g")
    print(table)
    if args.out:
        Path(args.out).write_text(f"`python -m harness.selfcheck --model {args.model} --dataset {args.dataset} "
                                  f"--fragments {args.fragments} --threads {args.threads}` (fp32, CPU)\n\n{table}\n")


if __name__ == "__main__":
    main()
