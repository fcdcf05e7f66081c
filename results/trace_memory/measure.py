"""Peak memory of the hidden-prefix backend's trace at the tracer layer (SmolLM2, fp32, CPU, 1 thread): the prompt's
query rows only (the backend's path) against the eager [heads, S, S] attention weights it read before, and its
densities against the fast backend's. The peak is the process's resident high-water mark (reset before the trace)
above its resident size just before it.

    python results/trace_memory/measure.py rows 26      # the backend's path, 26 NaturalQA fragments
    python results/trace_memory/measure.py eager 6      # the eager weights, 6 fragments (26 do not fit in 24 GiB)
"""

import re
import sys
import time

import torch

from evals.retention import Retention
from harness.models.loading import ModelSpec, load
from methods.attention.tracing import densities, eager_attention, returned_weights, until_stopped
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.formation import Former
from methods.memory import LatentMemory
from methods.prompting import format_prompt

LAYER = 18                                       # SmolLM2's tracer layer


def resident(field: str) -> float:
    """/proc/self/status's `field` (VmRSS, VmHWM) in GiB."""
    return int(re.search(rf"{field}:\s+(\d+)", open("/proc/self/status").read()).group(1)) / 2**20


def main(path: str, fragments: int, data_dir: str = "../shared/data") -> None:
    torch.set_num_threads(1)
    model, tokenizer = load(ModelSpec("smollm2", "smollm2"))
    group = Retention("nqa", data_dir, groups=1, updates=fragments).groups(tokenizer)[0]
    former = Former(model, tokenizer, "shared_sink", keep_kv=True, keep_states=True)
    memory = LatentMemory()
    for text in group.texts():
        former.store(memory, text)
    prompt = format_prompt(tokenizer, group.target.question, "chat")
    backend = HiddenPrefixBackend(model)

    def eager_rows(memory, prompt_ids, layers):
        with eager_attention(model), returned_weights(model, layers, len(prompt_ids)) as rows:
            until_stopped(backend._run, memory, prompt_ids, use_cache=False)
        return rows

    trace = eager_rows if path == "eager" else backend.attention_rows
    before = resident("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")                  # reset the high-water mark
    start = time.perf_counter()
    rows = trace(memory, prompt, [LAYER])
    seconds, peak = time.perf_counter() - start, resident("VmHWM") - before
    mine = densities(rows[LAYER], memory.spans(), "mean")
    fast = densities(KVPrefixBackend(model).attention_rows(memory, prompt, [LAYER])[LAYER], memory.spans(), "mean")
    print(f"| {path} | {fragments} | {memory.n_tokens} | {len(prompt)} | {peak:.2f} | {seconds:.1f} | "
          f"{float((mine - fast).abs().max()):.2g} | {float(fast.abs().max()):.2g} |")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:])
