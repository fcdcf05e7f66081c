"""Speed benchmark: one question (trace + defragment + generate) against n stored fragments,
fast backend against hidden-prefix backend, side by side in one process.

    memdefrag-bench --sizes 5 10 20 --threads 2

The memory is formed once with everything both backends need, so both answer
from the very same fragments; the script checks that their outputs agree.
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
import torch

from evals.retention import Retention
from harness.errors import ConfigError, stops_on_config_error
from harness.models import ModelSpec, load
from methods.formation import Former
from methods.hidden_prefix import HiddenPrefixBackend
from methods.kv_prefix import KVPrefixBackend
from methods.memdefrag import MemDefrag
from methods.memory import LatentMemory
from methods.none import NoMemory
from methods.session import Session
from methods.vanilla import Vanilla


def timed_answer(session: Session, question: str, repeats: int) -> tuple[float, str]:
    """Best wall time of `repeats` answers (the least disturbed by a shared machine)."""
    best, text = float("inf"), ""
    for _ in range(repeats):
        start = time.perf_counter()
        text = session.ask(question).text
        best = min(best, time.perf_counter() - start)
    return best, text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="nqa")
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the table as Markdown here")
    args = parser.parse_args(argv)
    with stops_on_config_error("memdefrag-bench"):
        if args.threads < 1 or args.k < 1 or args.repeats < 1 or min(args.sizes) < 1:
            raise ConfigError(f"--threads {args.threads}, --k {args.k}, --repeats {args.repeats} and --sizes "
                              f"{args.sizes} must all be >= 1")
        Retention(args.dataset, args.data_dir, groups=1, updates=max(args.sizes)).check()
    torch.set_num_threads(args.threads)
    spec = ModelSpec("smollm2", "smollm2", tracer_layer=18, query_mode="mean")
    model, tokenizer = load(spec)
    methods = {"none": NoMemory(), "vanilla": Vanilla(),
               f"memdefrag_top{args.k}": MemDefrag(args.k, spec.tracer_layer, spec.query_mode)}
    backends = {"fast": KVPrefixBackend(model), "hidden_prefix": HiddenPrefixBackend(model)}
    rows = []
    for n in args.sizes:
        group = Retention(args.dataset, args.data_dir, groups=1, updates=n).groups(tokenizer)[0]
        former = Former(model, tokenizer, "shared_sink", keep_kv=True, keep_states=True)
        memory = LatentMemory()
        for text in [group.target.context + "\n\n", *group.distractors]:
            former.store(memory, text)
        memory.reorder(torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist())
        for method_name, method in methods.items():
            outputs = {}
            for backend_name, backend in backends.items():
                if method_name == "none" and backend_name != "fast":
                    continue
                session = Session(model, tokenizer, backend, method, "shared_sink", "chat")
                session.memory = memory
                seconds, outputs[backend_name] = timed_answer(session, group.target.question, args.repeats)
                rows.append({"n": n, "memory_tokens": memory.n_tokens, "method": method_name,
                             "backend": backend_name, "seconds": seconds})
            rows[-1]["same_output"] = len(set(outputs.values())) == 1
        print(pd.DataFrame(rows).tail(5).to_string(index=False), flush=True)
    table = summarize(pd.DataFrame(rows), f"memdefrag_top{args.k}")
    text = table.to_markdown(index=False, floatfmt=".2f")
    print(f"\nthreads={args.threads}, model=smollm2 (CPU fp32), one question each\n{text}")
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(f"threads={args.threads}, model=smollm2, dataset={args.dataset}\n\n{text}\n")


def summarize(frame: pd.DataFrame, defrag: str) -> pd.DataFrame:
    """One row per n: seconds per method and backend, and the ratios the targets are stated in."""
    wide = frame.pivot_table(index=["n", "memory_tokens"], columns=["method", "backend"], values="seconds")
    out = pd.DataFrame({
        "n": wide.index.get_level_values(0), "memory_tokens": wide.index.get_level_values(1),
        "none_s": wide[("none", "fast")].values,
        "vanilla_fast_s": wide[("vanilla", "fast")].values,
        "vanilla_hidden_s": wide[("vanilla", "hidden_prefix")].values,
        f"{defrag}_fast_s": wide[(defrag, "fast")].values,
        f"{defrag}_hidden_s": wide[(defrag, "hidden_prefix")].values,
    })
    out["vanilla_speedup"] = out["vanilla_hidden_s"] / out["vanilla_fast_s"]
    out[f"{defrag}_speedup"] = out[f"{defrag}_hidden_s"] / out[f"{defrag}_fast_s"]
    out[f"{defrag}_vs_none"] = out[f"{defrag}_fast_s"] / out["none_s"]
    same = frame.dropna(subset=["same_output"]).groupby("n")["same_output"].all()
    out["same_outputs"] = out["n"].map(same).values
    return out


if __name__ == "__main__":
    main()
