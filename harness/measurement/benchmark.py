"""Speed and memory of one question against n stored fragments (`memdefrag-bench`).

Per memory size and method: time to first token (the method's trace and defragmentation, then the
prefill), time per generated token and total time, every method decoding the same number of tokens
(end-of-turn ids do not stop it), and the trace alone: the best of --repeats questions right after the n-th
fragment is stored (one over the first n-1 was asked before, as in a retention run; the n-th is replaced by
another for each of them) and of --repeats other questions over the same memory (the trace keeps the placed
memory and its prompt's shared head for the next question), the methods taking turns question by question
in one process, thread count, device and dtype stated; and the steady time per token, past the steps an answer
sets up in (a captured one's warm-up and capture), from the other questions asked again for half the tokens.
--methods also takes the peers (text: the fragments' text prefilled in full for every question; ape, epic,
cacheblend at their defaults), with the share of memory tokens each recomputes (averaged over the layers).
Beside the methods, the anchor: transformers' own `generate(cache_implementation="static")` on the same model
over the same tokens as full prefill reads (the fragments' text, then the question), its per-token time the
best of --repeats, each row's per-token and steady times also stated as ratios to it (on a GPU transformers
compiles that step and replays it as a CUDA graph; on a CPU it steps its static cache eagerly). --hidden-prefix
also times the paper's formulation and checks that its outputs equal the fast backend's (many minutes per
point on a CPU). --shape runs a randomly initialised model of a real shape (speed and memory only, never
accuracy) instead of the embedded SmolLM2; on a GPU the peak memory is the CUDA allocator's. --profile FILE
writes, per size and method, the kernels of one more question over the full memory ranked by time
(harness/measurement/kernels.py).

    memdefrag-bench --sizes 10 26 --threads 1 --out results/speed_cpu.md
    memdefrag-bench --device cuda --dtype bfloat16 --shape llama31_8b --sizes 26 --out results/speed_gpu.md
    memdefrag-bench --shape llama31_8b --save-random /tmp/llama31_8b   # a checkpoint for `model=hf` runs
    memdefrag-bench --shape memoryllm_tiny --save-random /tmp/memoryllm_tiny   # for method=memoryllm runs
    memdefrag-bench --shape mplus_tiny --save-random /tmp/mplus_tiny           # for method=mplus runs
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from transformers import AutoModelForCausalLM

from evals.retention import Retention
from harness.errors import ConfigError, Interrupted, OneLineParser, raised, stops_on_config_error
from harness.measurement.device import device_name
from harness.measurement.kernels import kernels
from harness.models import cache
from harness.results.paths import nearest_existing, writable_file, writable_folder
from harness.models.loading import DTYPES, check_device
from harness.models.shapes import SHAPES, build, tokenizer_of
from methods.formation import Former
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.memdefrag import MemDefrag
from methods.memory import Fragment, LatentMemory
from methods.baselines import NoMemory, TextMemory, Vanilla
from methods.peers.ape import APE
from methods.peers.cacheblend import CacheBlend
from methods.peers.epic import EPIC
from methods.generation import Decode, clock, default_decode
from methods.prompting import format_prompt
from methods.session import Answer, Session
from methods.window import Window, positions


METHODS = ("none", "vanilla", "memdefrag")
PROFILED = 12                 # --profile: the kernels listed per method, the costliest first
PEERS = ("text", "ape", "epic", "cacheblend")        # full prefill and the other fixes, each at its defaults


def checkpoint_bytes(shape: str, dtype: str) -> int:
    """What --save-random writes for `shape` in `dtype`: its parameters' bytes (the tokenizer's few MB aside),
    counted on the meta device, where nothing is allocated."""
    chosen = SHAPES[shape]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(chosen.config_class(**chosen.config), dtype=DTYPES[dtype])
    return sum(p.numel() * p.element_size() for p in model.parameters())


def room_for_checkpoint(folder: str, shape: str, dtype: str) -> None:
    """Print what a random checkpoint of `shape` will take and the room where it goes (what a cut save left beside
    it counted, as the save removes it first); refuse in one line, before any weight is drawn, where the disk
    holding `folder` has less (an 8B shape is 16 to 20 GB)."""
    path = Path(folder)
    left = sum(cache.size_of(p) for p in cache.partials(path)) if path.parent.is_dir() else 0
    need, free = checkpoint_bytes(shape, dtype), shutil.disk_usage(nearest_existing(path)).free + left
    print(f"--save-random {folder}: {shape} in {dtype} takes about {need / 1e9:.3g} GB; {free / 1e9:.3g} GB free "
          f"there{f' ({left / 1e9:.3g} GB of it a cut save left, removed first)' if left else ''}", flush=True)
    if need > free:
        raise ConfigError(f"--save-random {folder}: {shape} in {dtype} needs about {need / 1e9:.3g} GB and the disk "
                          f"holding it has {free / 1e9:.3g} GB free; give a folder on a disk with room")


def save_random(shape: str, folder: str, device: str, dtype: str, tokenizer: str | None = None) -> None:
    """A loadable checkpoint of `shape` with random weights and the shape's tokenizer, for whole harness runs
    (`memdefrag model=hf model.source=<folder>`) of a real shape where real weights cannot travel. Written whole
    or not at all, into a folder the save makes (cache.written_whole): a save cut short (a timeout, a full disk)
    leaves no folder that a later run would take for a checkpoint, and the next save removes what it left."""
    room_for_checkpoint(folder, shape, dtype)
    model, tokens, _, _ = build(shape, device, dtype, tokenizer)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(model.config, name, getattr(tokens, name))
        setattr(model.generation_config, name, getattr(tokens, name))
    path = Path(folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with cache.locked(path), cache.written_whole(path) as partial:
            if path.exists():
                raise ConfigError(f"--save-random {folder}: another save wrote it meanwhile; it is kept as it is")
            model.save_pretrained(partial)
            tokens.save_pretrained(partial)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - a full disk: safetensors and tokenizers raise their own types for it
        raise ConfigError(f"--save-random {folder}: cannot be written ({raised(err)}); nothing of it is left") \
            from None


class PeakMemory:
    """Each session's own peak device memory while sessions take turns asking: what was allocated before any
    of them asked (weights, the stored memory), what the session keeps between its questions (a trace's
    placed memory) and the most one of its questions adds on top; the others' kept buffers are not its own.
    None off a GPU."""

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"
        self.base = torch.cuda.memory_allocated(device) if self.cuda else 0
        self.held: dict = defaultdict(int)
        self.peak: dict = defaultdict(int)

    def ask(self, key, session: Session, question: str, max_new_tokens: int | None = None) -> Answer:
        if not self.cuda:
            return session.ask(question, max_new_tokens=max_new_tokens)
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        answer = session.ask(question, max_new_tokens=max_new_tokens)
        added = torch.cuda.max_memory_allocated(self.device) - before
        self.peak[key] = max(self.peak[key], self.base + self.held[key] + added)
        self.held[key] += torch.cuda.memory_allocated(self.device) - before
        return answer

    def gib(self, key) -> float | None:
        return self.peak[key] / 2**30 if self.cuda else None


def sessions_of(model, tokenizer, methods: dict, backends: dict, new_tokens: int, decode: str | None = None) -> dict:
    """A session per (method, backend that can read its memory), no memory on the fast backend only; no session
    stops at an end-of-turn id, so that every method decodes `new_tokens`; a read past the model's trained window
    is timed, and counted (timed's past_window), not refused."""
    sessions = {}
    for method_name, method in methods.items():
        for backend_name, backend in backends.items():
            if backend_name in method.backends and (method_name != "none" or backend_name == "fast"):
                session = Session(model, tokenizer, backend(model), method, "shared_sink", "chat", new_tokens,
                                  window=Window.of(model, allow=True), decode=decode)
                session.stop = set()
                sessions[method_name, backend_name] = session
    return sessions


def over(session: Session, sink, fragments: list[Fragment]) -> Session:
    """The session reading a memory of `fragments` (its own list), its text memory to be prefilled in full (the
    baseline the peers cut down), as every timed or profiled question is asked."""
    session.memory = LatentMemory(sink, list(fragments))
    session.text.forget()
    return session


def timed(sessions: dict, memory: LatentMemory, stand_ins: list[Fragment], questions: list[str],
          meter: PeakMemory, short_budget: int | None) -> dict:
    """Per session: a question over the memory's first n-1 fragments (not timed); then each of `stand_ins`,
    last the memory's own n-th fragment, stored as the n-th in turn, each replacing the one before, with a
    question each (the time of a question right after an update: nothing placed for the last question can be
    reused); then the other questions over the memory, each right away again for `short_budget` tokens where
    given (see timings).
    Questions go round the sessions, so a burst of load on a shared host falls on one question of several
    methods, not on every question of one, and each method's best drops it. past_window: how many positions
    past the model's trained window the session's longest read went (0 inside)."""

    past = dict.fromkeys(sessions, 0)

    def ask(question: str, fragments: list[Fragment], budget: int | None = None) -> dict:
        answers = {}
        for key, session in sessions.items():
            answers[key] = meter.ask(key, over(session, memory.sink, fragments), question, budget)
            past[key] = max(past[key], session.window.take())
        return answers

    *earlier, last = memory.fragments
    updates = [*stand_ins, last]
    rounds = [ask(questions[0], earlier)]
    rounds += [ask(question, [*earlier, fragment]) for question, fragment in zip(questions[1:], updates)]
    short = []
    for question in questions[1 + len(updates):]:
        rounds.append(ask(question, memory.fragments))
        if short_budget is not None:
            short.append(ask(question, memory.fragments, short_budget))
    return {key: {**timings([answers[key] for answers in rounds], len(updates), [answers[key] for answers in short]),
                  "peak_gib": meter.gib(key), "past_window": past[key]} for key in sessions}


@dataclass(frozen=True)
class Hardware:
    """What the device measured here can do: bytes a copy moves per second (read and written, counted as the
    device's own tools count them) and matmul FLOP/s in the model's dtype."""

    bandwidth: float
    flops: float

    @classmethod
    def measured(cls, model) -> "Hardware":
        device, dtype = model.device, next(model.parameters()).dtype
        side = 4096 if device.type == "cuda" else 1024
        source = torch.empty(256 << 20 if device.type == "cuda" else 64 << 20, dtype=torch.uint8, device=device)
        target, a = torch.empty_like(source), torch.randn(side, side, dtype=dtype, device=device)
        copy = best_seconds(lambda: target.copy_(source), device)
        product = best_seconds(lambda: a @ a, device)
        return cls(2 * source.numel() / copy, 2 * side ** 3 / product)

    def floors(self, model, prompt_tokens: int, recomputed: float) -> dict:
        """Per generated token, the weights a step reads (stepped_weights) read once; before the first token, 2
        FLOPs per such parameter for every token the answer runs (the prompt and the recomputed memory; attention's
        own work left out)."""
        weights = stepped_weights(model)
        parameters = sum(p.numel() for p in weights)
        weight_bytes = sum(p.numel() * p.element_size() for p in weights)
        return {"floor_ms_per_token": 1000 * weight_bytes / self.bandwidth,
                "floor_ttft_s": 2 * parameters * (prompt_tokens + recomputed) / self.flops}


def stepped_weights(model) -> list[torch.Tensor]:
    """The parameters a step reads whole: every one but the input embeddings' table, of which a step reads a row per
    token (1.05 GB of Llama-3.1-8B's 16.1 GB in bf16), unless the output head is the same table (tied)."""
    table, head = model.get_input_embeddings().weight, model.get_output_embeddings()
    tied = head is not None and head.weight is table
    return [p for p in model.parameters() if tied or p is not table]


def best_seconds(work, device, repeats: int = 5) -> float:
    """The fastest of `repeats` timed runs of `work` after one warm-up, the device's queue drained each time."""
    work()
    times = []
    for _ in range(repeats):
        start = clock(device)
        work()
        times.append(clock(device) - start)
    return min(times)


class Stamps:
    """A streamer for `generate` that notes when each token reached the host (generate hands it over once its
    stop check has read it): the first put is the prompt, each later one a token."""

    def __init__(self, device: torch.device):
        self.device, self.times = device, []

    def put(self, value) -> None:
        self.times.append(clock(self.device))

    def end(self) -> None:
        pass


def static_generate_ms(model, ids: torch.Tensor, new_tokens: int, repeats: int) -> float:
    """Per generated token, transformers' own greedy `generate(cache_implementation="static")` on `ids` [T]
    (every one of `new_tokens` decoded: min_new_tokens): the best of `repeats` runs after a warm-up (a GPU's
    compilation), from the first token to the last."""
    inputs = ids.view(1, -1).to(model.device)
    best = float("inf")
    for _ in range(repeats + 1):
        stamps = Stamps(model.device)
        model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, cache_implementation="static", streamer=stamps,
                       pad_token_id=model.generation_config.eos_token_id or 0)
        token_times = stamps.times[1:]
        best = min(best, (token_times[-1] - token_times[0]) / max(len(token_times) - 1, 1))
    return 1000 * best


def timings(answers: list[Answer], updates: int, short: list[Answer]) -> dict:
    """From one session's answers (before the updates, right after each of them, then the others) and the others
    asked again for fewer tokens (`short`, maybe none): the fastest total right after an update and the fastest
    other answer's phases, time to first token, per-token time (all of the answer's decoding: its fixed cache, a
    captured one's eager warm-up and capture, none where it replayed a kept graph: `replayed`, every step), steady
    per-token time and total time. Steady: (fastest full decoding - fastest short decoding) / tokens more, the two
    alike in replaying or not, so that the set-up, spent alike, nearly cancels, as the anchor leaves its own out
    (the short answers' fixed caches are a little smaller); replayed ones first, none where no two are alike."""
    after_update, others = answers[1:1 + updates], answers[1 + updates:]
    best = min(others, key=lambda answer: sum(answer.seconds.values()))
    seconds = best.seconds
    to_first_token = sum(v for k, v in seconds.items() if k != "decode")
    steady = None
    pairs = ([[answer for answer in asked if answer.replayed == replayed] for asked in (others, short)]
             for replayed in (True, False))
    alike = next((pair for pair in pairs if all(pair)), None)
    if alike:
        full, less = (min(asked, key=lambda answer: answer.seconds["decode"]) for asked in alike)
        steady = 1000 * (full.seconds["decode"] - less.seconds["decode"]) / (full.tokens - less.tokens)
    return {"update_total_s": min(sum(answer.seconds.values()) for answer in after_update), "ttft_s": to_first_token,
            "per_token_ms": 1000 * seconds["decode"] / max(best.tokens - 1, 1), "replayed": best.replayed,
            "steady_per_token_ms": steady,
            "total_s": to_first_token + seconds["decode"], "trace_s": seconds.get("trace", 0.0), "tokens": best.tokens,
            "recomputed": best.recomputed, "prompt_tokens": best.prompt_tokens,
            "output": tuple(answer.text for answer in answers)}


# Tokens of an answer up to which a captured one sets up: the first comes from the prefill logits, the second from
# the eager warm-up step, the third from the capture step (its graph's first replay); later ones from replays.
SET_UP = 3


def short_budget(new_tokens: int) -> int | None:
    """The budget the other questions are asked again with, for the steady per-token time: half, never under SET_UP;
    None where that leaves fewer than 2 tokens to tell the budgets apart."""
    short = max(new_tokens // 2, SET_UP)
    return short if new_tokens - short >= 2 else None


def steady_header(new_tokens: int) -> str:
    """What the table's steady columns are, for its header (nothing where the budget leaves none)."""
    short = short_budget(new_tokens)
    return "" if short is None else (
        f"steady: (the others' fastest decoding - the same questions' asked for {short} tokens) / {new_tokens - short} "
        f"tokens, the answers' set-up (fixed cache; on a GPU, decode=captured or compiled: eager warm-up and "
        f"capture) nearly cancelled, as the anchor leaves its own out; ")


def ratio(a: float | None, b: float) -> float | None:
    return None if a is None else a / b


def retention(args: argparse.Namespace, updates: int) -> Retention:
    """The groups one memory size reads: one stores the memory; the others give the questions (one before the
    updates, --repeats right after one, --repeats over the same memory) and the stand-in n-th fragments."""
    return Retention(args.dataset, args.data_dir, groups=1 + 2 * args.repeats, updates=updates)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="memdefrag-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="nqa")
    parser.add_argument("--data-dir", default=os.environ.get("MEMDEFRAG_DATA", "../shared/data"),
                        help="default: $MEMDEFRAG_DATA, else ../shared/data")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 26], help="stored fragments per point")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="other questions asked after the first")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS + PEERS, help="what to time")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2], help="MemDefrag Top-K values to time")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens every method generates")
    parser.add_argument("--hidden-prefix", action="store_true", help="also time the paper's formulation")
    parser.add_argument("--decode", choices=[d.value for d in Decode], help="how answers decode (default: captured "
                        "on a GPU, eager elsewhere)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:<index> or auto")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES), help="a random model of this shape")
    parser.add_argument("--out", default=None, help="also write the table as Markdown here")
    parser.add_argument("--profile", metavar="FILE", help="also write each method's kernels, ranked, here")
    parser.add_argument("--save-random", metavar="FOLDER", help="only save a random checkpoint of --shape there")
    parser.add_argument("--tokenizer", metavar="FOLDER", help="--shape's tokenizer (default: the embedded SmolLM2's)")
    args = parser.parse_args(argv)
    with stops_on_config_error("memdefrag-bench"):
        numbers = {"--threads": args.threads, "--repeats": args.repeats, "--new-tokens": args.new_tokens,
                   "--sizes": min(args.sizes), "--k": min(args.k)}
        bad = {name: value for name, value in numbers.items() if value < 1}
        if bad:
            raise ConfigError(f"{', '.join(f'{n} {v}' for n, v in bad.items())}: must be >= 1")
        check_device(args.device, "--device")
        if args.save_random and not args.shape:
            raise ConfigError("--save-random needs --shape (the embedded model has real weights already)")
        if args.tokenizer and not args.shape:
            raise ConfigError(f"--tokenizer {args.tokenizer}: needs --shape (the embedded model brings its own)")
        for flag, path in (("--out", args.out), ("--profile", args.profile)):
            if path:
                writable_file(flag, path)
        if args.save_random:
            if os.path.lexists(args.save_random):
                raise ConfigError(f"--save-random {args.save_random}: exists already (a checkpoint is written whole, "
                                  f"into a folder the save makes); give a path that does not exist yet")
            writable_folder("--save-random", args.save_random)
        tokenizer = tokenizer_of(args.tokenizer)
        if not args.save_random:                  # saving a random checkpoint reads no data
            try:
                retention(args, max(args.sizes)).groups(tokenizer)     # data for every size, or one line
            except ConfigError as err:
                raise ConfigError(in_flags(str(err))) from None
    return args


TASK_FLAGS = {"task.dataset": "--dataset", "task.data_dir": "--data-dir", "task.updates": "--sizes",
              "task.groups": "groups (1 + 2 x --repeats)"}


def in_flags(message: str) -> str:
    """A retention task's refusal in the bench's own flags: `task.data_dir='x'` as `--data-dir 'x'`."""
    for key, flag in TASK_FLAGS.items():
        message = re.sub(rf"{re.escape(key)}=(\S+)", rf"{flag} \1", message)
    return message


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    with stops_on_config_error("memdefrag-bench"):       # Ctrl-C, SIGTERM, a refusal on the way (no room): one line
        measure(args)


def measure(args: argparse.Namespace) -> None:
    """The command's work, its arguments checked: a random checkpoint saved, or the tables timed and written."""
    torch.set_num_threads(args.threads)
    if args.save_random:
        save_random(args.shape, args.save_random, args.device, args.dtype, args.tokenizer)
        print(args.save_random)
        return
    model, tokenizer, tracer_layer, query_mode = build(args.shape, args.device, args.dtype, args.tokenizer)
    methods = {"none": NoMemory(), "text": TextMemory(), "vanilla": Vanilla(),
               **{f"memdefrag_top{k}": MemDefrag(k, tracer_layer, query_mode) for k in args.k},
               "ape": APE(), "epic": EPIC(), "cacheblend": CacheBlend()}
    methods = {name: m for name, m in methods.items() if name.split("_top")[0] in args.methods}
    hardware = Hardware.measured(model)
    backends = {"fast": KVPrefixBackend}
    if args.hidden_prefix:
        backends["hidden_prefix"] = HiddenPrefixBackend
    rows, profiled = [], []
    timed_sizes, step_graphs = [], 0
    try:
        for n in args.sizes:
            group, *others = retention(args, n).groups(tokenizer)
            questions = [other.target.question for other in others]
            questions.insert(args.repeats, group.target.question)      # asked right after the last update
            former = Former(model, tokenizer, "shared_sink", keep_kv=True, keep_states=args.hidden_prefix)
            memory = LatentMemory()
            for text in group.texts():
                former.store(memory, text)
            memory.reorder([*torch.randperm(n - 1, generator=torch.Generator().manual_seed(0)).tolist(), n - 1])
            stand_ins = [former.next_fragment(memory, other.texts()[n - 1]) for other in others[1:args.repeats]]
            sessions = sessions_of(model, tokenizer, methods, backends, args.new_tokens, args.decode)
            before = compiled_graphs()
            per_session = timed(sessions, memory, stand_ins, questions, PeakMemory(model.device),
                                short_budget(args.new_tokens))
            step_graphs += compiled_graphs() - before      # the anchor's compiled generate left out
            anchor_ids = torch.cat([memory.text_ids(), format_prompt(tokenizer, questions[-1], "chat")])
            anchor = static_generate_ms(model, anchor_ids, args.new_tokens, args.repeats)
            anchor_past = Window.of(model).past(positions(len(anchor_ids), 0, args.new_tokens))
            for (method_name, backend_name), timing in per_session.items():
                floors = hardware.floors(model, timing["prompt_tokens"], timing["recomputed"])
                floor = floors["floor_ms_per_token"]
                rows.append({"n": n, "memory_tokens": memory.n_tokens, "method": method_name,
                             "backend": backend_name, **timing, **floors,
                             "per_token_vs_floor": timing["per_token_ms"] / floor,
                             "steady_vs_floor": ratio(timing["steady_per_token_ms"], floor),
                             "static_generate_ms": anchor, "static_generate_past_window": anchor_past,
                             "per_token_vs_static_generate": timing["per_token_ms"] / anchor,
                             "steady_vs_static_generate": ratio(timing["steady_per_token_ms"], anchor),
                             "ttft_vs_floor": timing["ttft_s"] / floors["floor_ttft_s"]})
            print(pd.DataFrame(rows).drop(columns="output").tail(len(sessions)).to_string(index=False),
                  flush=True)
            where, text = tabled(args, model, hardware, rows, step_graphs)   # before profiling, which may fail
            timed_sizes.append(n)
            if args.profile:
                profiled += profiles(sessions, memory, questions[-1], n)
                write(args.profile, f"{where}; one more question per method over the full memory, its {PROFILED} "
                                    f"costliest kernels and all of them",
                      pd.concat(profiled).to_markdown(index=False, floatfmt=".3g") if profiled else "")
    except KeyboardInterrupt:
        raise Interrupted(sizes_kept(timed_sizes, args)) from None
    print(f"\n{where}\n{text}")


def sizes_kept(timed_sizes: list[int], args: argparse.Namespace) -> str:
    """What an interrupted bench kept: the sizes it timed of those asked, and where their table is."""
    timed = f"--sizes {' '.join(map(str, timed_sizes))} timed" if timed_sizes else "no size timed"
    kept = f", their table in {args.out}" if timed_sizes and args.out else ""
    return f"{timed} of {' '.join(map(str, args.sizes))}{kept}"


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (none before dynamo is imported)."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    return dynamo_utils.counters["stats"]["unique_graphs"] if dynamo_utils else 0


def tabled(args: argparse.Namespace, model, hardware: Hardware, rows: list[dict],
           step_graphs: int) -> tuple[str, str]:
    """The header and the Markdown table of the rows so far, written to --out if given; step_graphs: the graphs
    decode=compiled compiled for the decoding step (one per read that dynamo could not serve from one it had)."""
    table = summarize(pd.DataFrame(rows))
    compiled = f" (graphs the step compiled: {step_graphs})" if args.decode == Decode.compiled else ""
    anchor = "compiled, a CUDA graph" if model.device.type == "cuda" else "not compiled off a GPU"
    where = (f"model={args.shape or 'smollm2'}{' (random weights)' if args.shape else ''}, "
             f"device={model.device} ({device_name(model.device)}), dtype={args.dtype}, "
             f"threads={torch.get_num_threads()}, "
             f"dataset={args.dataset}, {args.new_tokens} generated tokens, best of {args.repeats} questions right "
             f"after an update and of {args.repeats} others over the same memory, methods taking turns; "
             f"{steady_header(args.new_tokens)}the floors: "
             f"weights read once per token (the input embeddings' table aside, unless tied to the output head) at "
             f"the copy bandwidth measured here ({hardware.bandwidth / 1e9:.3g} GB/s), "
             f"2 FLOPs per parameter per token run before the first at the matmul rate measured here "
             f"({hardware.flops / 1e12:.3g} TFLOP/s); the anchor: transformers' generate(cache_implementation="
             f"'static') per token over the fragments' text and the question ({anchor}), best of {args.repeats}; "
             f"decode={args.decode or default_decode(model.device)}{compiled}; the model's trained window: "
             f"{Window.of(model).limit or 'none declared'} positions (past_window: how far past it a row's longest "
             f"read went, 0 inside; reads past it are timed like any other, their answers not scored)")
    text = table.astype(object).where(table.notna(), "").to_markdown(index=False, floatfmt=".3g")
    if args.out:
        write(args.out, where, text)
    return where, text


def write(path: str, header: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(f"{header}\n\n{text}\n")


def profiles(sessions: dict, memory: LatentMemory, question: str, n: int) -> list[pd.DataFrame]:
    """Each session's kernels for one more question over the full memory, asked as when timed; a profile that
    fails (CUDA graphs under the profiler are not always supported) is one line, the tables already written."""
    ranked = []
    for (method_name, backend_name), session in sessions.items():
        try:
            ranked.append(kernels(over(session, memory.sink, memory.fragments), question, PROFILED)
                          .assign(n=n, method=method_name, backend=backend_name))
        except Exception as err:        # noqa: BLE001 - the profiler's failure is a line, not the bench's end
            print(f"memdefrag-bench: --profile: {method_name} at n={n} not profiled: {type(err).__name__}: {err}",
                  flush=True)
    return [frame[["n", "method", "backend", "kernel", "calls", "ms", "share"]] for frame in ranked]


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Every timing, the total against the no-memory question's, the time to first token against full prefill's
    (text) and MemDefrag Top-1's where they ran, and whether both backends agree."""
    none = frame[frame.method == "none"].set_index("n")["total_s"]
    frame = frame.assign(vs_none=frame["total_s"] / frame["n"].map(none),
                         update_vs_none=frame["update_total_s"] / frame["n"].map(none),
                         recomputed_share=frame.pop("recomputed") / frame["memory_tokens"])
    for reference in ("text", "memdefrag_top1"):          # the first token against full prefill and MemDefrag's
        base = frame[(frame.method == reference) & (frame.backend == "fast")].set_index("n")["ttft_s"]
        if len(base):
            frame[f"ttft_vs_{reference}"] = frame["ttft_s"] / frame["n"].map(base)
    fast = frame[frame.backend == "fast"].set_index(["n", "method"])
    slow = frame[frame.backend != "fast"]
    if not slow.empty:
        keys = list(zip(slow.n, slow.method))
        frame.loc[slow.index, "speedup"] = slow["total_s"].to_numpy() / fast.loc[keys, "total_s"].to_numpy()
        same = [a == b for a, b in zip(fast.loc[keys, "output"], slow["output"])]     # every question's answer
        frame.loc[slow.index, "same_output"] = ["yes" if s else "NO" for s in same]
    return frame.drop(columns="output").dropna(axis=1, how="all")


if __name__ == "__main__":
    main()
