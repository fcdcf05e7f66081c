"""MemoryLLM and M+, native: the same checkpoint layout, memory and logits as the authors' code
(tests/testdata/memoryllm: reference.pt, made by make_reference.py there from the tiny models tiny.py defines),
defragmentation that moves whole injections, and whole runs on tiny checkpoints."""

import json
from pathlib import Path

import pytest
import torch

from harness.running.runner import run
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.memoryllm.memoryllm import MemoryLLM, PoolWriter
from methods.memoryllm.checkpoint import MemoryLLMConfig, MemoryLLMForCausalLM
from methods.memoryllm.mplus import MPlus, MPlusWriter
from methods.memoryllm.slots import LEAD, SlotMemory
from tests.conftest import tiny_run_config
from tests.testdata.memoryllm.tiny import VARIANTS, fill

REFERENCE = Path(__file__).parent / "testdata" / "memoryllm"


def close(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Equal up to fp32 rounding: a max abs difference within 1e-5 of the reference's scale (at least 1)."""
    return ours.shape == theirs.shape and (ours - theirs).abs().max() <= 1e-5 * max(1.0, theirs.abs().max().item())


@pytest.fixture(scope="module")
def reference():
    return torch.load(REFERENCE / "reference.pt")


def tiny_model(reference, variant: str) -> MemoryLLMForCausalLM:
    """This project's model of the reference's tiny `variant`: from the config the authors' code saved, with
    the weights tiny.py fills in both."""
    return fill(MemoryLLMForCausalLM(MemoryLLMConfig.from_dict(reference[f"{variant}/config"])))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_authors_checkpoint_layout_is_the_one_this_project_loads(reference, variant):
    """Every state-dict name and shape of the authors' model (LoRA adapters, pool, long-term memory, retriever
    projections): their checkpoints load into this project's model as saved."""
    ours = {name: tuple(t.shape) for name, t in tiny_model(reference, variant).state_dict().items()}
    assert ours == reference[f"{variant}/layout"]


def written(reference, variant: str, start: str) -> tuple[MemoryLLMForCausalLM, PoolWriter, list]:
    """The reference's tiny `variant`, its pool as filled or emptied, after writing the reference's contexts;
    and the pool's states after each."""
    model = tiny_model(reference, variant)
    if start == "empty":
        model.initialized.fill_(0)
    writer = PoolWriter(model, None, torch.Generator().manual_seed(reference["seed"]))
    states = []
    for context in reference["contexts"]:
        writer.admit(writer.memory, writer.next_fragment(writer.memory, "", kept=context.tolist()))
        states.append(writer.memory.states.clone())
    return model, writer, states


@pytest.mark.parametrize("start", ["initialized", "empty"])
@pytest.mark.parametrize("variant", ["plain", "lora"])
def test_memory_and_logits_are_the_authors(reference, variant, start):
    """plain: one random drop for every layer; lora: write and read adapters, a drop per layer."""
    expected = reference[f"{variant}/{start}"]
    model, writer, states = written(reference, variant, start)
    for ours, theirs in zip(states, expected["memories"]):
        assert close(ours, theirs)
    logits, _, _ = HiddenPrefixBackend(model).prefill(writer.memory, reference["question"])
    assert close(logits, expected["logits"])


def test_mplus_memory_long_term_memory_and_logits_are_the_authors(reference):
    """Three injections: the second joins the cache of dropped slots to the long-term memory (some entries
    decay out), the third leaves one cache waiting; the question retrieves from both at every layer."""
    expected = reference["mplus"]
    model = tiny_model(reference, "mplus")
    writer = MPlusWriter(model, None, torch.Generator().manual_seed(reference["seed"]))
    memory = writer.memory
    for context, states, sizes in zip([*reference["contexts"], expected["third"]], expected["memories"],
                                      expected["long_term_sizes"]):
        writer.admit(memory, writer.next_fragment(memory, "", kept=context.tolist()))
        assert close(memory.states, states)
        assert [len(entry.states) for entry in memory.long_term] == sizes
    assert expected["long_term_sizes"][1][0] < 24 + 2 * 8                      # the merge let some decay out
    assert memory.cached is not None and len(memory.cached[0].states) == 8      # the third injection's, waiting
    backend = HiddenPrefixBackend(model)
    plan = MPlus().plan(memory, reference["question"], backend)
    retrieved = model.config.num_ltm_blocks * model.config.num_tokens
    assert (plan.latent.origin[:, :retrieved] == LEAD).all() and plan.latent.n_tokens == retrieved + memory.n_tokens
    logits, _, _ = backend.prefill(plan.latent, reference["question"])
    assert close(logits, expected["logits"])


def test_mplus_defragmentation_keeps_the_retrieved_slots_first(reference):
    model = tiny_model(reference, "mplus")
    writer = MPlusWriter(model, None, torch.Generator().manual_seed(reference["seed"]))
    for context in reference["contexts"]:
        writer.admit(writer.memory, writer.next_fragment(writer.memory, "", kept=context.tolist()))
    backend = HiddenPrefixBackend(model)
    plain = MPlus().plan(writer.memory, reference["question"], backend).latent
    plan = MPlus(defragment=True, tracer_layer=1).plan(writer.memory, reference["question"], backend)
    retrieved = model.config.num_ltm_blocks * model.config.num_tokens
    assert torch.equal(plan.latent.states[:, :retrieved], plain.states[:, :retrieved])
    assert sorted(plan.latent.order) == sorted(writer.memory.order) and set(plan.seconds) >= {"retrieve", "trace"}
    spans = plan.latent.spans(1)
    assert spans[0][0] == 1 + retrieved and spans[-1][1] == 1 + plan.latent.n_tokens


def test_a_reordered_mplus_pool_keeps_every_slot_with_its_age(reference):
    model = tiny_model(reference, "mplus")
    writer = MPlusWriter(model, None, torch.Generator().manual_seed(reference["seed"]))
    memory = writer.memory
    for context in reference["contexts"]:
        writer.admit(memory, writer.next_fragment(memory, "", kept=context.tolist()))
    before = {(fid, tuple(state.tolist())): age for fid, state, age in
              zip(memory.origin[1].tolist(), memory.states[1], memory.ages[1])}
    memory.reorder(list(range(len(memory)))[::-1])
    after = {(fid, tuple(state.tolist())): age for fid, state, age in
             zip(memory.origin[1].tolist(), memory.states[1], memory.ages[1])}
    assert after == before and memory.order[0] == 1 and memory.ages.shape == tuple(memory.states.shape[:2])


def test_slots_remember_their_injection_through_per_layer_drops(reference):
    model, writer, _ = written(reference, "lora", "initialized")
    memory, config = writer.memory, model.config
    assert memory.order == [-4, -3, -2, -1, 0, 1] and memory.n_tokens == config.num_blocks * config.num_tokens
    assert (memory.origin[:, -config.num_tokens:] == 1).all()               # the newest injection is whole
    assert not torch.equal(memory.origin[0], memory.origin[1])               # each layer dropped its own slots
    for layer in range(config.num_hidden_layers):                            # spans cover the pool in order
        spans = memory.spans(layer)
        assert spans[0][0] == 1 and spans[-1][1] == 1 + memory.n_tokens
        assert all(end == start for (_, end), (start, _) in zip(spans, spans[1:]))


def test_defragmentation_moves_whole_injections_densest_last(reference):
    model, writer, _ = written(reference, "lora", "initialized")
    memory = writer.memory
    plan = MemoryLLM(defragment=True, tracer_layer=1, query_mode="last").plan(
        memory, reference["question"], HiddenPrefixBackend(model))
    view, density = plan.latent, plan.densities
    assert sorted(view.order) == sorted(memory.order) and view.n_tokens == memory.n_tokens
    assert [density[memory.order.index(fid)] for fid in view.order] == sorted(density.tolist())
    for layer in range(model.config.num_hidden_layers):
        origin = view.origin[layer].tolist()
        runs = [fid for i, fid in enumerate(origin) if i == 0 or origin[i - 1] != fid]
        assert runs == [fid for fid in view.order if fid in origin]          # one run per injection, in order
        for fid in runs:                                                     # its slots, unchanged, in order
            assert torch.equal(view.states[layer][view.origin[layer] == fid],
                               memory.states[layer][memory.origin[layer] == fid])
    assert memory.order == [-4, -3, -2, -1, 0, 1]                            # the stored pool is untouched


def test_a_selection_that_would_leave_layers_uneven_is_refused(reference):
    _, writer, _ = written(reference, "lora", "initialized")
    with pytest.raises(ValueError, match="different numbers of slots"):
        writer.memory.arranged([0, 5])
    with pytest.raises(ValueError, match="not a permutation"):
        writer.memory.reorder([0, 0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="backend=hidden_prefix"):
        SlotMemory().stacked("keys", dim=2)


@pytest.mark.parametrize("method", ["memoryllm", "memoryllm_defrag", "mplus", "mplus_defrag"])
def test_a_retention_run_goes_end_to_end(tmp_path, request, method):
    checkpoint = request.getfixturevalue("tiny_mplus" if method.startswith("mplus") else "tiny_memoryllm")
    cfg = tiny_run_config(checkpoint, f"method={method}", "backend=hidden_prefix", "task.updates=5",
                          "task.groups=2", "task.eval_steps=[1,5]", "model.query_mode=last")
    metrics = run(cfg, str(tmp_path))
    assert list(metrics["step"]) == [1, 5]
    records = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    pool, retrieved = (6 * 16, 2 * 16) if method.startswith("mplus") else (8 * 16, 0)
    assert all(r["memory_tokens"] == pool for r in records)                   # the pool keeps its size
    assert all(r["used_tokens"] == 1 + retrieved + pool for r in records)
    assert all((r["target_rank"] is not None) == method.endswith("defrag") for r in records)


def test_longbench_runs_unchanged_on_a_model_with_its_own_memory(tmp_path, tiny_mplus):
    cfg = tiny_run_config(tiny_mplus, "task=longbench", "method=mplus_defrag", "backend=hidden_prefix",
                          "task.groups=1", "task.max_tokens=100000", "task.chunking=fixed", "task.chunk_tokens=512",
                          "model.query_mode=last", small_task=False)
    metrics = run(cfg, str(tmp_path))
    assert set(metrics["subset"]) == {"fictional_passages", "fictional_document"}
    assert metrics["target_rank"].notna().all() and (metrics["memory_tokens"] == 6 * 16).all()


@pytest.mark.parametrize("overrides, message", [
    (["method=memoryllm"], "backend=fast: method=memoryllm reads its memory with backend=hidden_prefix"),
    (["method=memoryllm", "backend=hidden_prefix", "forgetting=informativeness"],
     "method=memoryllm keeps a memory of its own"),
])
def test_what_memoryllm_cannot_do_is_refused_before_work(tmp_path, tiny_memoryllm, overrides, message):
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        run(tiny_run_config(tiny_memoryllm, *overrides), str(tmp_path))


def test_a_model_of_the_wrong_kind_is_refused_before_its_weights_load(tmp_path, tiny_checkpoint, tiny_memoryllm,
                                                                     tiny_mplus):
    from harness.errors import ConfigError

    for checkpoint, method, message in (
            (tiny_checkpoint, "memoryllm", "method memoryllm needs a checkpoint of model_type 'memoryllm'"),
            (tiny_mplus, "memoryllm", "this checkpoint is M\\+ .*use method=mplus"),
            (tiny_memoryllm, "mplus", "this checkpoint is MemoryLLM .*use method=memoryllm")):
        with pytest.raises(ConfigError, match=message):
            run(tiny_run_config(checkpoint, f"method={method}", "backend=hidden_prefix"), str(tmp_path))
