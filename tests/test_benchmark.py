"""memdefrag-bench end to end on a tiny random shape, the path a GPU run takes (--shape, --device, --dtype)."""

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness.measurement.benchmark import PROFILED, PeakMemory, main, short_budget, timings
from harness.measurement.device import device_name
from methods.session import Answer


def test_the_benchmark_times_every_method_at_a_fixed_answer_length_and_checks_both_backends(tmp_path, capsys):
    out = tmp_path / "speed.md"
    main(["--shape", "tiny", "--sizes", "2", "3", "--new-tokens", "5", "--repeats", "2", "--threads", "1",
          "--hidden-prefix", "--out", str(out)])
    header, _, *lines = out.read_text().splitlines()
    assert header.startswith(f"model=tiny (random weights), device=cpu ({device_name(torch.device('cpu'))}), "
                             f"dtype=float32, threads=1")
    table = pd.DataFrame([[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]],
                         columns=[c.strip() for c in lines[0].strip("|").split("|")])
    assert sorted(set(table.method)) == ["memdefrag_top1", "memdefrag_top2", "none", "vanilla"]
    assert len(table) == 2 * 7                                  # none on the fast backend only
    assert set(table.tokens) == {"5"}                           # no method stops early
    hidden = table[table.backend == "hidden_prefix"]
    assert set(hidden.same_output) == {"yes"} and all(float(s) > 0 for s in hidden.speedup)
    traced = table[table.method.str.startswith("memdefrag")]
    assert all(0 < float(t) < float(total) for t, total in zip(traced.trace_s, traced.total_s))
    assert all(float(r) == 1.0 for r in table[table.method == "none"].vs_none)
    assert all(float(f) > 0 for f in table.update_total_s)     # the question right after an update, apart
    floors = table[["floor_ms_per_token", "per_token_vs_floor", "floor_ttft_s", "ttft_vs_floor"]].astype(float)
    assert (floors > 0).all().all() and "the floors: weights read once per token" in header    # how far from the
    assert len(set(table.floor_ms_per_token)) == 1                                         # hardware each figure is


def test_a_random_checkpoint_of_a_shape_runs_through_the_harness(tmp_path):
    from harness.running.runner import run
    from tests.conftest import tiny_run_config

    main(["--shape", "tiny", "--save-random", str(tmp_path / "tiny")])
    cfg = tiny_run_config(str(tmp_path / "tiny"), "method=memdefrag_top2", "task.groups=1")
    metrics = run(cfg, str(tmp_path / "run"))
    assert list(metrics["step"]) == [1, 2, 3]


def test_an_offline_gpu_node_saves_and_times_a_shape_with_a_tokenizer_folder_and_no_data(tmp_path, monkeypatch):
    """What a GPU node without the embedded model has: a tokenizer folder; saving a random checkpoint reads no
    data (--data-dir names none), and the bench takes its tokenizer from the folder, not from SmolLM2."""
    from harness.models import shapes

    main(["--shape", "tiny", "--save-random", str(tmp_path / "first")])
    monkeypatch.setattr(shapes, "check_source", lambda spec: pytest.fail("the embedded model was read"))
    main(["--shape", "tiny", "--save-random", str(tmp_path / "second"), "--tokenizer", str(tmp_path / "first"),
          "--data-dir", str(tmp_path / "nowhere")])
    assert (tmp_path / "second" / "tokenizer.json").is_file() and any((tmp_path / "second").glob("*.safetensors"))
    out = tmp_path / "speed.md"
    main(["--shape", "tiny", "--tokenizer", str(tmp_path / "second"), "--dataset", "synthetic", "--sizes", "2",
          "--new-tokens", "2", "--repeats", "1", "--methods", "vanilla", "--out", str(out)])
    assert "model=tiny (random weights)" in out.read_text()


@pytest.mark.parametrize("size", ["1", "2"])
def test_the_benchmark_times_only_the_methods_asked_for(size, tmp_path):
    """One fragment too: its first question is asked over the sink alone, before the fragment is stored."""
    out = tmp_path / "speed.md"
    main(["--shape", "tiny", "--sizes", size, "--new-tokens", "2", "--repeats", "1", "--methods", "vanilla",
          "--out", str(out)])
    rows = out.read_text().splitlines()[4:]
    assert len(rows) == 1 and "| vanilla " in rows[0]


def test_the_benchmark_times_the_peers_and_what_share_of_the_memory_they_recompute(tmp_path):
    out = tmp_path / "speed.md"
    main(["--shape", "tiny", "--sizes", "3", "--new-tokens", "2", "--repeats", "1", "--methods", "text", "ape",
          "epic", "cacheblend", "--hidden-prefix", "--out", str(out)])
    header, _, *lines = out.read_text().splitlines()[2:]
    cells = lambda line: [cell.strip() for cell in line.strip("|").split("|")]      # noqa: E731
    rows = {f"{row['method']} {row['backend']}": row for row in (dict(zip(cells(header), cells(line)))
                                                                  for line in lines)}
    assert sorted(rows) == ["ape fast", "cacheblend fast", "epic fast", "epic hidden_prefix", "text fast",
                            "text hidden_prefix"]
    share = {key: float(row["recomputed_share"]) for key, row in rows.items()}
    assert share["text fast"] == 1 and share["ape fast"] == 0 and 0 < share["epic fast"] < share["cacheblend fast"] < 1
    assert rows["epic hidden_prefix"]["same_output"] == "yes"     # the same answers on both backends
    assert float(rows["text fast"]["ttft_vs_text"]) == 1 and float(rows["epic fast"]["ttft_vs_text"]) > 0


def test_each_sessions_peak_memory_is_its_own_while_sessions_take_turns(monkeypatch):
    """On a GPU, a method's peak is what was there before any session asked, what it keeps between its
    questions and the most one question adds, never the buffers another session keeps (a scripted allocator
    stands in for the CUDA one, which this machine has not)."""
    allocator = {"now": 100 * 2**30, "top": 0}

    def take(size: int) -> None:
        allocator["now"] += size * 2**30
        allocator["top"] = max(allocator["top"], allocator["now"])

    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocator["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocator["top"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: allocator.update(
        top=allocator["now"]))

    class Asking:
        def __init__(self, keeps: int, needs: int):
            self.keeps, self.needs = keeps, needs

        def ask(self, question, max_new_tokens=None):
            take(self.keeps)
            self.keeps = 0
            take(self.needs)
            take(-self.needs)
            return question

    meter = PeakMemory(torch.device("cuda"))
    tracer, plain = Asking(keeps=10, needs=5), Asking(keeps=0, needs=20)
    for question in ["first", "second"]:
        for key, session in [("tracer", tracer), ("plain", plain)]:
            assert meter.ask(key, session, question) == question
    assert meter.gib("tracer") == 115 and meter.gib("plain") == 120      # not 130: the tracer's 10 are not its own
    assert PeakMemory(torch.device("cpu")).gib("plain") is None


def test_the_benchmark_reads_its_data_from_memdefrag_data(tmp_path, monkeypatch, capsys):
    """An offline GPU node points every command at its data with MEMDEFRAG_DATA, the bench included."""
    from harness.measurement.benchmark import parse

    monkeypatch.setenv("MEMDEFRAG_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit):
        parse(["--shape", "tiny", "--sizes", "2"])
    assert str(tmp_path / "nowhere") in capsys.readouterr().err


def test_a_random_checkpoint_states_its_size_first_and_is_refused_where_the_disk_lacks_room(tmp_path, monkeypatch,
                                                                                           capsys):
    """The 8B shapes write 16 to 20 GB each: the size is printed before any weight is drawn, and a disk with less
    room refuses in one line with nothing written."""
    import shutil
    from collections import namedtuple

    main(["--shape", "tiny", "--save-random", str(tmp_path / "saved")])
    said = capsys.readouterr().out.splitlines()[0]
    written = sum(f.stat().st_size for f in (tmp_path / "saved").glob("*.safetensors"))
    stated = float(said.split("about ")[1].split(" GB")[0]) * 1e9
    assert said.startswith(f"--save-random {tmp_path / 'saved'}: tiny in float32") and abs(stated / written - 1) < 0.01
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(written, written - (4 << 20), 4 << 20))
    with pytest.raises(SystemExit) as stopped:
        main(["--shape", "tiny", "--save-random", str(tmp_path / "full")])
    err = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and "\n" not in err and "GB free" in err and not (tmp_path / "full").exists()


def test_a_random_checkpoint_cut_short_leaves_no_folder_and_the_next_save_clears_what_it_left(tmp_path, monkeypatch):
    """A save killed by a timeout (results/run_gpu.sh bounds each part) must not leave a folder that the next part
    takes for a checkpoint (run_gpu.sh uses a folder that exists), nor 16 GB of its parts on a 64 GiB disk."""
    from transformers import PreTrainedModel

    def cut(self, folder, **kwargs):
        (Path(folder) / "model-00001-of-00004.safetensors").parent.mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model-00001-of-00004.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt                                   # the timeout's signal, mid-write

    with monkeypatch.context() as patched:
        patched.setattr(PreTrainedModel, "save_pretrained", cut)
        with pytest.raises(SystemExit) as stopped:
            main(["--shape", "tiny", "--save-random", str(tmp_path / "ckpt")])
    assert stopped.value.code == 130 and not (tmp_path / "ckpt").exists() and not list(tmp_path.glob(".ckpt.*.tmp"))
    killed = tmp_path / ".ckpt.999999.tmp"                        # what a SIGKILLed writer leaves
    killed.mkdir()
    (killed / "config.json").write_text("{}")
    main(["--shape", "tiny", "--save-random", str(tmp_path / "ckpt")])
    assert not killed.exists() and (tmp_path / "ckpt" / "config.json").is_file()
    assert any((tmp_path / "ckpt").glob("*.safetensors"))


def test_a_random_checkpoint_that_fills_the_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    """safetensors and tokenizers say a full disk in exceptions of their own (not OSError): one line still, and
    nothing of the cut save is left."""
    from transformers import PreTrainedModel

    def full(self, folder, **kwargs):
        Path(folder).mkdir()
        (Path(folder) / "model.safetensors").write_bytes(b"cut")
        raise Exception("No space left on device (os error 28)")     # noqa: TRY002 - what safetensors raises

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full)
    with pytest.raises(SystemExit) as stopped:
        main(["--shape", "tiny", "--save-random", str(tmp_path / "ckpt")])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err == (f"memdefrag-bench: error: --save-random {tmp_path / 'ckpt'}: cannot be "
                                               f"written (Exception: No space left on device (os error 28)); nothing "
                                               f"of it is left\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.lock"]


def test_the_room_a_checkpoint_needs_counts_what_a_cut_save_left_as_it_is_removed_first(tmp_path, monkeypatch,
                                                                                       capsys):
    """On a 64 GiB disk a cut 8B save leaves 16 GB: the next save removes it before it writes, so the room check
    counts it free (else the rerun would be refused for the room its own leftovers take). Another entry's
    temporaries, and a name with glob characters, are told apart."""
    import shutil
    from collections import namedtuple

    target = tmp_path / "ck[8b]"
    left = tmp_path / ".ck[8b].4242.tmp"
    left.mkdir()
    (left / "model.safetensors").write_bytes(bytes(24 << 20))   # 24 MiB a cut save wrote
    other = tmp_path / ".ck[8b].v2.4243.tmp"                     # another entry's (`ck[8b].v2`) temporary
    other.mkdir()
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2 << 30, 2 << 30, 4 << 20))    # 4 MiB free
    main(["--shape", "tiny", "--save-random", str(target)])           # 26 MB: room only once the cut save goes
    said = capsys.readouterr().out.splitlines()[0]
    assert "0.0294 GB free there (0.0252 GB of it a cut save left, removed first)" in said, said
    assert not left.exists() and other.exists() and (target / "config.json").is_file()


def test_each_rows_per_token_time_is_stated_against_transformers_static_generate(tmp_path):
    """The anchor (issue 56): transformers' own generate(cache_implementation="static") timed in the same run, on
    the same model over the tokens full prefill reads, and every row's per-token time as a ratio to it."""
    out = tmp_path / "speed.md"
    main(["--shape", "tiny", "--sizes", "2", "--new-tokens", "8", "--repeats", "1", "--methods", "none", "vanilla",
          "--decode", "captured", "--out", str(out)])
    header, _, *lines = out.read_text().splitlines()
    table = pd.DataFrame([[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]],
                         columns=[c.strip() for c in lines[0].strip("|").split("|")])
    anchor = table.static_generate_ms.astype(float)
    assert len(set(anchor)) == 1 and anchor.iloc[0] > 0
    ratio = table.per_token_ms.astype(float) / anchor
    assert (abs(table.per_token_vs_static_generate.astype(float) / ratio - 1) < 0.02).all()
    steady = table.steady_per_token_ms.astype(float) / anchor   # a difference of 4 steps' times: any sign
    assert steady.notna().all() and "steady: (the others' fastest decoding - the same questions' asked for 4" in header
    assert (abs(table.steady_vs_static_generate.astype(float) - steady) <= 0.02 * abs(steady)).all()
    assert "the anchor: transformers' generate(cache_implementation='static')" in header and "decode=captured" in header


def test_the_steady_time_per_token_is_the_full_answers_decoding_less_the_shorter_ones_per_token_more():
    """Per token past an answer's set-up (a captured answer's warm-up and capture, in both budgets alike): what the
    anchor times. Each budget's fastest decoding; none without the shorter answers (a budget too short for them)."""
    def answer(decode: float, tokens: int) -> Answer:
        return Answer("", 0, {}, {"plan": 0.01, "prefill": 0.02, "decode": decode}, tokens)

    asked = [answer(9.0, 32), answer(9.0, 32), answer(3.1, 32), answer(3.0, 32)]   # before, after the update, others
    timing = timings(asked, 1, [answer(1.8, 16), answer(1.4, 16)])
    assert timing["steady_per_token_ms"] == pytest.approx(1000 * (3.0 - 1.4) / 16)
    assert timing["per_token_ms"] == pytest.approx(1000 * 3.0 / 31)
    assert timings(asked, 1, [])["steady_per_token_ms"] is None
    assert [short_budget(n) for n in (32, 6, 5, 4, 2)] == [16, 3, 3, None, None]
    # on a GPU an answer replaying a kept graph spends no set-up: each side is taken from answers alike in that
    replayed = [answer(9.0, 32), answer(9.0, 32), dataclasses.replace(answer(2.9, 32), replayed=True), answer(3.0, 32)]
    short = [answer(1.8, 16), dataclasses.replace(answer(1.2, 16), replayed=True)]
    timing = timings(replayed, 1, short)
    assert timing["steady_per_token_ms"] == pytest.approx(1000 * (2.9 - 1.2) / 16) and timing["replayed"]
    assert timings(replayed, 1, short[:1])["steady_per_token_ms"] == pytest.approx(1000 * (3.0 - 1.8) / 16)
    assert timings(replayed, 1, short[1:])["steady_per_token_ms"] == pytest.approx(1000 * (2.9 - 1.2) / 16)


def test_the_profile_ranks_each_methods_kernels_by_their_time(tmp_path):
    """--profile: per method, one more question's kernels (a CPU's operators here, by their own time), the
    costliest first, then all of them: the listed ones a part of the whole, a matrix product among them."""
    profile = tmp_path / "kernels.md"
    main(["--shape", "tiny", "--sizes", "2", "--new-tokens", "4", "--repeats", "1", "--methods", "none", "vanilla",
          "--profile", str(profile)])
    header, _, *lines = profile.read_text().splitlines()
    table = pd.DataFrame([[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]],
                         columns=[c.strip() for c in lines[0].strip("|").split("|")])
    assert "one more question per method over the full memory" in header
    assert list(table.method.unique()) == ["none", "vanilla"]
    for _, ranked in table.groupby("method"):
        listed, whole = ranked.iloc[:-1], ranked.iloc[-1]
        ms = listed.ms.astype(float)
        assert whole.kernel == "(all)" and float(whole.share) == 1 and 1 < len(listed) <= PROFILED
        assert list(ms) == sorted(ms, reverse=True) and ms.sum() <= float(whole.ms) * 1.001
        assert int(whole.calls) >= listed.calls.astype(int).sum()
        assert listed.kernel.str.contains(r"aten::(?:addmm|mm|bmm|matmul|linear)").any(), ranked


@pytest.mark.parametrize("cpuinfo, name", [
    ("model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz\nmodel name\t: the second core",
     "Intel Xeon Platinum 8375C @ 2.90GHz"),
    ("processor\t: 0\nmodel name\t: AMD EPYC 7763 64-Core Processor\n", "AMD EPYC 7763 64-Core"),
    ("model name\t: Intel(R) Xeon(R) Processor\n", "Intel Xeon"),
    ("model name\t: Intel(R) Xeon(R) Processor @ 2.50GHz\n", "Intel Xeon @ 2.50GHz"),
    ("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n", "cpu ("),          # an Arm server: no names
])
def test_a_cpu_is_named_by_its_model_as_the_tables_show_it(cpuinfo, name):
    """tab:runtime's rows name the machine their seconds are of: a CPU by its model, trademarks and clock left
    out; where the kernel names none, by its architecture."""
    from harness.measurement.device import cpu_model

    assert cpu_model(cpuinfo).startswith(name) and "(R)" not in cpu_model(cpuinfo)


def test_an_interrupted_bench_says_which_sizes_it_timed_and_where_their_table_is(tmp_path, monkeypatch, capsys):
    """Ctrl-C (or SIGTERM) at the second size: one line naming the size timed and --out, which holds its rows."""
    import harness.measurement.benchmark as bench

    timed = []

    def anchor_then_ctrl_c(*args):
        if timed:
            raise KeyboardInterrupt
        timed.append(args)
        return 1.0

    monkeypatch.setattr(bench, "static_generate_ms", anchor_then_ctrl_c)
    out = tmp_path / "speed.md"
    with pytest.raises(SystemExit) as ended:
        main(["--shape", "tiny", "--sizes", "2", "3", "--new-tokens", "2", "--repeats", "1", "--methods", "none",
              "--out", str(out)])
    assert ended.value.code == 130
    assert capsys.readouterr().err == f"memdefrag-bench: interrupted: --sizes 2 timed of 2 3, their table in {out}\n"
    assert [line.split("|")[1].strip() for line in out.read_text().splitlines()[4:]] == ["2"]


@pytest.mark.parametrize("tied", [False, True])
def test_the_floor_counts_the_weights_a_step_reads_not_the_input_embeddings_table_unless_it_is_the_head(tied):
    """A step reads one row of an untied input embedding (Llama-3.1-8B: 1.05 of 16.1 GB in bf16): the floor leaves
    it out; a tied one is the output head's table, read whole."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.measurement.benchmark import Hardware

    config = LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    model = LlamaForCausalLM(config)
    table = model.get_input_embeddings().weight
    read = sum(p.numel() for p in model.parameters()) - (0 if tied else table.numel())
    floors = Hardware(bandwidth=4e6, flops=2e9).floors(model, prompt_tokens=10, recomputed=0)
    assert floors["floor_ms_per_token"] == pytest.approx(1000 * 4 * read / 4e6)
    assert floors["floor_ttft_s"] == pytest.approx(2 * read * 10 / 2e9)


def test_a_compiled_decodes_header_counts_the_graphs_its_step_compiled(tmp_path, monkeypatch):
    """Every read of the bench (two methods, two answer budgets) served by one compile of the step; the graphs of
    transformers' compiled anchor (on a GPU; stood in for here) are not the step's."""
    import harness.measurement.benchmark as bench
    from torch._dynamo.utils import counters

    from methods.generation import compiled_next_id

    def compiled_anchor(*args):
        counters["stats"]["unique_graphs"] += 2
        return 1.0

    monkeypatch.setattr(bench, "static_generate_ms", compiled_anchor)
    torch._dynamo.reset()                      # as a fresh process: the step not compiled yet
    compiled_next_id.cache_clear()
    out = tmp_path / "speed.md"
    main(["--shape", "tiny", "--sizes", "2", "--new-tokens", "3", "--repeats", "1", "--methods", "none", "vanilla",
          "--decode", "compiled", "--out", str(out)])
    assert "decode=compiled (graphs the step compiled: 1)" in out.read_text().splitlines()[0]
