"""The trained window: what a config declares, the positions every read takes against it, the refusal and the
labelled opt-in."""

import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, LlamaConfig, MistralConfig, Phi3Config,
                          Qwen2Config)

from evals.locomo import PROTOCOLS, ProtocolName
from harness.errors import ConfigError
from harness.report.document import write
from harness.results.folder import read_config
from harness.running.runner import preflight, run
from harness.report.window_records import summarize, with_beyond_window
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.baselines import NoMemory, TextMemory, Vanilla
from methods.formation import Formation
from methods.memdefrag import MemDefrag
from methods.peers.ape import APE
from methods.prompting import format_prompt
from methods.session import Session
from methods.window import Window, WindowError, marked, trained_window, window_summary
from tests.conftest import COMMON, FAMILIES, FRAGMENTS, save_tiny_checkpoint, tiny_model, tiny_run_config
from tests.test_report import fake_run

BACKENDS = {"fast": KVPrefixBackend, "hidden_prefix": HiddenPrefixBackend}

WINDOWS = [   # (config, its trained window)
    (LlamaConfig(**COMMON), 512),
    (FAMILIES["llama31"](), 512),                 # llama3 scaling: 8 x its pretraining 32 = 256, below the declared
    (Qwen2Config(**COMMON, rope_parameters=dict(rope_type="yarn", rope_theta=1e6, factor=4.0,
                                                original_max_position_embeddings=512)), 2048),   # yarn: 4 x 512
    (FAMILIES["gemma3"](), 512),                  # linear scaling on its global layers: the declared window already
    (FAMILIES["gemma2"](), 512),                  # sliding layers (12 keys) at the same 512 positions
    (MistralConfig(**COMMON, sliding_window=12), 512),
    (Phi3Config(**COMMON, rope_parameters=dict(rope_type="longrope", rope_theta=1e4, short_factor=[1.0] * 8,
                                               long_factor=[2.0] * 8, original_max_position_embeddings=128)), 512),
    (GPT2Config(n_positions=300, n_embd=64, n_layer=2, n_head=4), 300),     # the family's own field
]


@pytest.mark.parametrize("config, window", WINDOWS, ids=[f"{type(c).__name__}-{w}" for c, w in WINDOWS])
def test_the_trained_window_is_what_the_config_declares_scaled_only_where_a_pretraining_length_is_stated(config,
                                                                                                          window):
    assert trained_window(config) == window


def fed_positions(model):
    """A hook on the decoder: the highest position id it is given, plus one, over every forward."""
    seen = []

    def hook(module, args, kwargs):
        if kwargs.get("position_ids") is not None:             # a read (a fragment's formation starts at 0)
            seen.append(int(kwargs["position_ids"].max()) + 1)
    return seen, model.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)


def answered(model, tokenizer, backend, method, formation, window, budget=5):
    """The answer of one question over FRAGMENTS (stored with no window), read under `window` (the session's
    own: it watches its reads), decoding the whole budget."""
    session = Session(model, tokenizer, BACKENDS[backend](model), method, formation, "plain", budget,
                      window=Window(None))
    session.stop = set()
    for text in FRAGMENTS:
        session.store(text)
    session.window = window
    return session.ask("where did the cat sit?")


READS = [(family, backend, formation) for family in ("llama", "gemma2") for backend in BACKENDS
         for formation in Formation] + [("llama", "fast", "text"), ("gemma2", "fast", "text"),
                                        ("llama", "fast", "none")]


@pytest.mark.parametrize("family, backend, formation", READS, ids=["-".join(r) for r in READS])
def test_a_read_takes_the_positions_it_is_given_and_past_the_window_is_refused_or_counted(family, backend,
                                                                                        formation, tokenizer):
    """Sink and memory (or text), prompt and answer budget: the count the window checks is the positions the
    decoder is given, on a sliding-window family (gemma2) too."""
    model = tiny_model(family)
    method = {"text": TextMemory(), "none": NoMemory()}.get(formation, Vanilla())
    formation = formation if formation in Formation.__members__ else "shared_sink"
    seen, handle = fed_positions(model)
    answer = answered(model, tokenizer, backend, method, formation, Window(None))
    handle.remove()
    used = max(seen)
    assert used == answer.memory_tokens + answer.prompt_tokens + 5 - 1      # the record's used_tokens, prompt, budget
    inside = Window(used)
    answered(model, tokenizer, backend, method, formation, inside)
    assert inside.take() == 0
    with pytest.raises(WindowError, match=re.escape(f"a read with the answer's budget takes {used} positions, 1 "
                                                    f"past the model's trained window of {used - 1}: store less or ask "
                                                    f"for fewer tokens, or pass Session(window=Window.of(model, "
                                                    f"allow=True))")):
        answered(model, tokenizer, backend, method, formation, Window(used - 1))
    allowed = Window(used - 7, allow=True)
    answered(model, tokenizer, backend, method, formation, allowed)
    assert allowed.take() == 7 and allowed.take() == 0


def test_a_session_given_no_window_counts_its_reads_against_its_model_s_own(tokenizer):
    """A library user's session, no window given: a read past the model's trained window is refused in one
    line naming the model and the way to allow it; allowed (Window.of), it is read and counted."""
    model = tiny_model("llama")
    seen, handle = fed_positions(model)
    answered(model, tokenizer, "fast", Vanilla(), "shared_sink", Window(None))
    handle.remove()
    model.config.max_position_embeddings, model.config.name_or_path = max(seen) - 1, "tiny-llama"
    session = Session(model, tokenizer, KVPrefixBackend(model), Vanilla(), "shared_sink", "plain", 5)
    session.stop = set()
    for text in FRAGMENTS:
        session.store(text)
    with pytest.raises(WindowError, match=re.escape(f"takes {max(seen)} positions, 1 past model tiny-llama's "
                                                    f"trained window of {max(seen) - 1}: store less or ask for "
                                                    f"fewer tokens, or pass Session(window=Window.of(model, "
                                                    f"allow=True))")):
        session.ask("where did the cat sit?")
    session.window = Window.of(model, allow=True)
    session.ask("where did the cat sit?")
    assert session.window.take() == 1


def test_a_parallel_read_takes_the_longest_fragment_s_positions_not_the_memory_s(llama, tokenizer):
    """APE places every fragment after the sink: the window counts the positions it is given, fewer than the
    memory it reads."""
    seen, handle = fed_positions(llama)
    answer = answered(llama, tokenizer, "fast", APE(), "shared_sink", Window(None))
    handle.remove()
    assert max(seen) < answer.memory_tokens + answer.prompt_tokens + 5 - 1
    allowed = Window(max(seen) - 3, allow=True)
    answered(llama, tokenizer, "fast", APE(), "shared_sink", allowed)
    assert allowed.take() == 3


def test_a_trace_over_the_whole_memory_counts_though_the_answer_reads_one_fragment(llama, tokenizer):
    """MemDefrag's Top-1 answer fits, its trace over every fragment does not: the trace is a read too."""
    method = MemDefrag(1, 1, "mean")
    seen, handle = fed_positions(llama)
    answer = answered(llama, tokenizer, "fast", method, "shared_sink", Window(None))
    handle.remove()
    answer_read = answer.memory_tokens + answer.prompt_tokens + 5 - 1
    assert max(seen) > answer_read
    with pytest.raises(WindowError, match=f"a read takes {max(seen)} positions"):
        answered(llama, tokenizer, "fast", method, "shared_sink", Window(answer_read))


def test_the_summary_counts_the_records_past_the_window():
    records = [{"beyond_window": 0}, {"beyond_window": 12}, {"beyond_window": 3}, {}]
    assert window_summary(100, True, records) == {"trained": 100, "allow_beyond": True, "records_beyond": 2,
                                                  "most_beyond": 12}


@pytest.fixture(scope="module")
def short_window(tmp_path_factory):
    """The tiny checkpoint with a trained window of 400 positions."""
    folder = tmp_path_factory.mktemp("short_window")
    save_tiny_checkpoint(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 400}))
    return str(folder)


SHORT = ("method=vanilla", "task.groups=2", "task.updates=3")


def test_a_run_whose_stored_memory_cannot_fit_is_refused_before_weights_load_in_one_line(short_window, tmp_path,
                                                                                        monkeypatch):
    """Nothing forgotten: the most a group stores (the task's texts, known before any weights) is the memory's
    full read (its first read past the window was the refusal, after the weights loaded)."""
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ConfigError) as refused:
        run(tiny_run_config(short_window, *SHORT), str(tmp_path / "run"))
    line = str(refused.value)
    assert "\n" not in line
    assert re.match(r"task Retention: group \d stores 3 fragments of \d+ tokens in all, none forgotten: a full "
                    r"memory's read \(sink 1 \+ \d+ \+ prompt \d+ \+ answer budget 4 - 1\) takes \d+ positions, \d+ "
                    r"past model tiny_llama's trained window of 400: store fewer or shorter fragments, or forget", line)


def test_a_capacity_that_cannot_fit_is_refused_before_weights_load(short_window, tmp_path, monkeypatch):
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ConfigError, match=r"model.memory_capacity=390: a full memory's read \(sink 1 \+ 390 \+ "
                                          r"prompt \d+ \+ answer budget 4 - 1\) takes \d+ positions"):
        run(tiny_run_config(short_window, *SHORT, "forgetting=random", "model.memory_capacity=390"),
            str(tmp_path / "run"))


FULL_READS = [(formation, "chat") for formation in Formation] + [("shared_prefix", "plain")]


@pytest.mark.parametrize("formation, prompt", FULL_READS, ids=["-".join(r) for r in FULL_READS])
def test_the_capacity_check_counts_a_full_memory_s_read_as_the_read_takes_it(formation, prompt, tiny_checkpoint):
    """The preflight's count of a full memory's read (sink, capacity, the empty question's prompt, the budget) is
    the positions the decoder is given: under shared_prefix the chat header, led by the sink token, is the sink."""
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_checkpoint), AutoTokenizer.from_pretrained(
        tiny_checkpoint)
    window = Window(0, allow=True)                  # every read counted whole, as positions past no window
    session = Session(model, tokenizer, KVPrefixBackend(model), Vanilla(), formation, prompt, 4, window=window)
    for text in FRAGMENTS:
        session.store(text)
    with window.watching(model):
        session.ask("")
    limit = trained_window(model.config)
    fits = session.memory.n_tokens + limit - window.take()     # the capacity whose full read takes every position
    overrides = (f"formation={formation}", f"prompt={prompt}", "forgetting=random")
    preflight(tiny_run_config(tiny_checkpoint, *overrides, f"model.memory_capacity={fits}"))
    with pytest.raises(ConfigError, match=f"takes {limit + 1} positions, 1 past model tiny_llama's trained window"):
        preflight(tiny_run_config(tiny_checkpoint, *overrides, f"model.memory_capacity={fits + 1}"))


LOCOMO = ("task=locomo", "task.groups=1", "forgetting=random")
BUDGETS = {"locomo": 50, "authors": 32}                 # each protocol's answer budget (the run's: 4)


@pytest.mark.parametrize("protocol", BUDGETS)
def test_the_capacity_check_counts_the_answer_budget_the_task_asks_with(protocol, tiny_checkpoint):
    """LoCoMo asks every question with its protocol's budget, not the run's: the preflight counts that one."""
    with pytest.raises(ConfigError, match=rf"\+ answer budget {BUDGETS[protocol]} - 1\) takes"):
        preflight(tiny_run_config(tiny_checkpoint, *LOCOMO, f"task.protocol={protocol}",
                                  "model.memory_capacity=8192", small_task=False))


def protocol_prompt(checkpoint, protocol: str, question: str = "") -> int:
    """The prompt LoCoMo's protocol reads, counted here from its declaration: its instruction, in the model's chat
    template under `locomo` (the tiny tokenizer has one) whatever the run's style, plain under `authors`."""
    declared = PROTOCOLS[ProtocolName(protocol)]
    style = {"locomo": "chat", "authors": "plain"}[protocol]
    return len(format_prompt(AutoTokenizer.from_pretrained(checkpoint), declared.instruction.format(question=question),
                             style))


def test_an_older_record_counts_the_answer_budget_and_prompt_its_task_asked_with(short_window):
    """harness.report.window_records counts a task's budget and prompt by the preflight's rule: an older LoCoMo record's
    answer took its protocol's budget and its protocol's wording of the question."""
    record = {"used_tokens": 400, "memory_tokens": 399, "question": "?", "output": ""}    # a full window, then more
    past = {}
    for protocol in BUDGETS:
        config = tiny_run_config(short_window, *LOCOMO, f"task.protocol={protocol}", small_task=False)
        past[protocol] = with_beyond_window(OmegaConf.to_container(config, resolve=True), [record])[0]["beyond_window"]
    prompts = {protocol: protocol_prompt(short_window, protocol, "?") for protocol in BUDGETS}
    assert prompts["locomo"] > prompts["authors"] + 20
    assert past["locomo"] - past["authors"] == (BUDGETS["locomo"] - BUDGETS["authors"]
                                                + prompts["locomo"] - prompts["authors"])


@pytest.mark.parametrize("protocol, run_style", [("locomo", "plain"), ("locomo", "chat"), ("authors", "chat")])
def test_the_capacity_check_counts_the_prompt_the_task_asks_with(protocol, run_style, tiny_checkpoint):
    """LoCoMo words its questions in its protocol's style, not the run's (`prompt`): the preflight counts the
    prompt its empty question takes there (LoCoMo's instruction in the chat template; the authors' plain)."""
    prompt = protocol_prompt(tiny_checkpoint, protocol)
    with pytest.raises(ConfigError, match=rf"\+ prompt {prompt} \+ answer budget {BUDGETS[protocol]} - 1\) takes"):
        preflight(tiny_run_config(tiny_checkpoint, *LOCOMO, f"task.protocol={protocol}", f"prompt={run_style}",
                                  "model.memory_capacity=8192", small_task=False))


LONGBENCH_BUDGETS = {"hotpotqa": 32, "qasper": 128}      # tests/testdata/longbench's dataset2maxlen.json
LONGBENCH = ("task=longbench", "task.dataset=longbench", "task.subsets=[hotpotqa,qasper]",
             f"task.data_dir={Path(__file__).parent / 'testdata'}", "forgetting=random")


@pytest.mark.parametrize("setting, budget", [("null", 128), ("16", 16)])
def test_the_capacity_check_counts_the_largest_answer_budget_longbench_asks_with(setting, budget, tiny_checkpoint):
    """LongBench asks each subset with dataset2maxlen.json's budget (hotpotqa 32, qasper 128) unless
    task.max_new_tokens sets one: the preflight counts the largest it asks with, not the run's 4."""
    with pytest.raises(ConfigError, match=rf"\+ answer budget {budget} - 1\) takes"):
        preflight(tiny_run_config(tiny_checkpoint, *LONGBENCH, f"task.max_new_tokens={setting}",
                                  "model.memory_capacity=8192", small_task=False))


def test_an_answer_budget_that_fills_the_window_is_the_task_s_when_it_declares_one(short_window):
    """A budget that alone takes every position of the trained window (400) is refused, with the opt-in too: the
    budget the task asks with, not the run's."""
    with pytest.raises(ConfigError, match=r"the answer budget 400 task LongBench asks with must be smaller than the "
                                          r"model's 400 positions \(model tiny_llama\)"):
        preflight(tiny_run_config(short_window, *LONGBENCH, "task.max_new_tokens=400", "allow_beyond_window=true",
                                  small_task=False))
    # the run's budget, which LongBench (here at most 128) never asks with
    preflight(tiny_run_config(short_window, *LONGBENCH, "max_new_tokens=600", "allow_beyond_window=true",
                              small_task=False))


def test_an_older_longbench_record_counts_its_own_subset_s_answer_budget_and_template(short_window):
    """harness.report.window_records counts the budget and prompt an older LongBench record's answer took: its subset's
    (by the preflight's rule on the task of that subset: the template's part after its context, in the chat
    template); a record that names none, the largest budget and the shortest prompt the task asks with."""
    record = {"used_tokens": 400, "memory_tokens": 399, "question": "?", "output": ""}    # a full window, then more
    config = OmegaConf.to_container(tiny_run_config(short_window, *LONGBENCH, small_task=False), resolve=True)
    assert config["task"]["prompt"] == "chat"
    templates = json.loads((Path(__file__).parent / "testdata" / "longbench" / "dataset2prompt.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(short_window)
    prompts = {subset: len(format_prompt(tokenizer, templates[subset].split("{context}")[1].lstrip().format(input="?"),
                                         "chat")) for subset in LONGBENCH_BUDGETS}
    assert prompts["hotpotqa"] > prompts["qasper"]
    past = {subset: with_beyond_window(config, [{**record, "subset": subset}])[0]["beyond_window"]
            for subset in LONGBENCH_BUDGETS}
    assert past["qasper"] - past["hotpotqa"] == (LONGBENCH_BUDGETS["qasper"] - LONGBENCH_BUDGETS["hotpotqa"]
                                                 + prompts["qasper"] - prompts["hotpotqa"])
    assert with_beyond_window(config, [record])[0]["beyond_window"] == past["qasper"]


def test_with_the_opt_in_every_record_says_how_far_past_and_run_json_counts_them(short_window, tmp_path):
    run(tiny_run_config(short_window, *SHORT, "allow_beyond_window=true"), str(tmp_path / "run"))
    records = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    past = [r["beyond_window"] for r in records]
    assert past[0] == 0 and max(past) > 0 and all(p >= 0 for p in past)
    for r in records:           # a record's read: its memory and prompt, then the 4-token budget
        assert r["beyond_window"] >= r["used_tokens"] - 400
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["window"] == {"trained": 400, "allow_beyond": True, "records_beyond": sum(p > 0 for p in past),
                              "most_beyond": max(past)}


@pytest.mark.parametrize("method, formation", [("vanilla", "shared_sink"), ("memdefrag_top1", "shared_sink"),
                                               ("vanilla", "shared_prefix")])
def test_an_older_record_gets_the_beyond_window_its_run_would_have_measured(method, formation, short_window,
                                                                            tmp_path):
    """harness.report.window_records estimates a record written before the window was checked from its used_tokens, its
    question's prompt (under shared_prefix the part after the header its sink holds) and the run's budget (and,
    for a method that traces, its whole memory): on a run that measured them, the estimate is the measure;
    run.json's summary follows the records."""
    folder = tmp_path / "run"
    run(tiny_run_config(short_window, *SHORT, f"method={method}", f"formation={formation}",
                        "allow_beyond_window=true"), str(folder))
    records = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    config = OmegaConf.to_container(read_config(folder))
    older = [{k: v for k, v in r.items() if k != "beyond_window"} for r in records]
    assert with_beyond_window(config, older) == records and max(r["beyond_window"] for r in records) > 0
    info = json.loads((folder / "run.json").read_text())
    measured = info.pop("window")
    (folder / "run.json").write_text(json.dumps(info))
    assert summarize(folder, config, records) and json.loads((folder / "run.json").read_text())["window"] == measured
    assert not summarize(folder, config, records)                  # said already: nothing written


def test_an_older_answer_that_read_no_memory_counts_its_whole_prompt(short_window):
    """Session reads the whole prompt, its header included, where an answer reads no memory: under shared_prefix
    too, window_records counts it whole (past the 400 positions by the prompt and a 390-token budget)."""
    record = {"used_tokens": 0, "memory_tokens": 0, "question": "?", "output": ""}
    whole = len(format_prompt(AutoTokenizer.from_pretrained(short_window), "?", "chat"))
    for formation in ("shared_sink", "shared_prefix"):
        config = tiny_run_config(short_window, "method=none", f"formation={formation}", "max_new_tokens=390")
        past = with_beyond_window(OmegaConf.to_container(config, resolve=True), [record])[0]["beyond_window"]
        assert past == whole + 390 - 1 - 400


def test_an_older_record_of_a_model_no_longer_at_hand_is_left_as_it_is(short_window):
    config = {"model": {"name": "gone", "source": "/nowhere/checkpoint"}}
    records = [{"used_tokens": 9000, "question": "?", "output": ""}]
    assert with_beyond_window(config, records) == records


def test_a_table_marks_a_run_that_read_past_the_window_and_no_other_and_a_step_table_each_cell_that_did(tmp_path):
    """A step table marks the cells whose answers read past the window (their records' beyond_window), in one row per
    dataset and step: a run past the window at step 5 is not marked at step 1, where its one fragment fits."""
    assert marked("vanilla", True) == "vanilla (past window)" and marked("vanilla", False) == "vanilla"
    beyond = {"window": {"trained": 8192, "allow_beyond": True, "records_beyond": 2, "most_beyond": 40}}
    inside = {"window": {"trained": 8192, "allow_beyond": False, "records_beyond": 0, "most_beyond": 0}}
    steps = [{"group": g, "step": s, "correct": g == 0, "memory_tokens": 10, "seconds": {"decode": 1.0},
              "beyond_window": 40 * (s == 5 and g == 1)} for g in (0, 1) for s in (1, 5)]
    inside_steps = [{**r, "beyond_window": 0} for r in steps]
    for dataset, info, records in (("nqa", beyond, steps), ("synthetic", inside, inside_steps)):
        fake_run(tmp_path / "r" / dataset, "Retention", "vanilla", records, info=info, dataset=dataset)
    for method, info, records in (("memdefrag_top1", beyond, steps), ("text", inside, inside_steps)):
        fake_run(tmp_path / "p" / method, "Retention", method, records, info=info, study="peers", dataset="synthetic")
    readme = write(tmp_path).read_text()
    assert 'A cell marked "†"' in readme and '"(past window)" (a run' in readme              # the legend
    retention = readme.split("(`tab:retention`)")[1].split("\n## ")[0]
    assert re.search(r"\| nqa +\| 1 +\| 50.0 \[9.5, 90.5\] +\|", retention)           # one fragment: inside
    assert re.search(r"\| nqa +\| 5 +\| 50.0 \[9.5, 90.5\] † +\|", retention)
    assert re.search(r"\| synthetic +\| 5 +\| 50.0 \[9.5, 90.5\] +\|", retention)
    assert "past window" not in retention and retention.count("vanilla") == 1           # one column, no row split
    peers = [[c.strip() for c in line.strip("|").split("|")] for line in
             readme.split("(`tab:peers`)")[1].split("\n## ")[0].splitlines() if line.startswith("| smollm2")]
    assert [(row[2], row[-1]) for row in peers] == [("text", "+0.0 (p 1, n 2)"),
                                                    ("memdefrag_top1 (past window)", "reference")]
