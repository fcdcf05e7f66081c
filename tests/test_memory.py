"""The memory store on random tensors: order, select, evict, save/load."""

import pytest
import torch

from methods.memory import Fragment, LatentMemory

L, KV, D, H = 3, 2, 4, 8


def fragment(fid, length):
    g = torch.Generator().manual_seed(fid)
    return Fragment(fid, f"text {fid}", torch.arange(length) + 10 * fid, torch.rand(length, generator=g),
                    keys=torch.randn(L, KV, length, D, generator=g), values=torch.randn(L, KV, length, D, generator=g),
                    states=torch.randn(L, length, H, generator=g))


@pytest.fixture
def memory():
    return LatentMemory(fragment(99, 1), [fragment(0, 3), fragment(1, 5), fragment(2, 2)])


def test_spans_follow_the_current_order(memory):
    assert memory.n_tokens == 10
    assert memory.spans() == [(1, 4), (4, 9), (9, 11)]
    view = memory.arranged([2, 0])
    assert view.ids() == [2, 0] and view.spans() == [(1, 3), (3, 6)] and view.sink is memory.sink
    assert memory.ids() == [0, 1, 2]                                   # a view leaves the store alone


def test_stacked_puts_the_sink_first(memory):
    keys = memory.arranged([1, 2]).stacked("keys", dim=2)
    assert keys.shape == (L, KV, 1 + 5 + 2, D)
    torch.testing.assert_close(keys[:, :, :1], memory.sink.keys)
    torch.testing.assert_close(keys[:, :, 1:6], memory.fragments[1].keys)


@pytest.mark.parametrize("order", [[0, 0], [3], [-1]])
def test_arranged_rejects_bad_orders(memory, order):
    with pytest.raises(ValueError, match="order"):
        memory.arranged(order)


def test_reorder_needs_a_permutation(memory):
    memory.reorder([2, 0, 1])
    assert memory.ids() == [2, 0, 1]
    with pytest.raises(ValueError, match="permutation"):
        memory.reorder([0, 1])


def test_keep_evicts_the_same_tokens_at_every_layer(memory):
    before = memory.fragments[1]
    memory.keep(1, torch.tensor([0, 2, 4]))
    after = memory.fragments[1]
    assert len(after) == 3 and memory.n_tokens == 8
    torch.testing.assert_close(after.keys, before.keys[:, :, [0, 2, 4]])
    torch.testing.assert_close(after.states, before.states[:, [0, 2, 4]])
    torch.testing.assert_close(after.self_info, before.self_info[[0, 2, 4]])   # travels with its token
    assert after.token_ids.tolist() == before.token_ids[[0, 2, 4]].tolist()


def test_save_and_load_round_trip(memory, tmp_path):
    memory.save(tmp_path / "m.pt")
    loaded = LatentMemory.load(tmp_path / "m.pt")
    assert loaded.ids() == memory.ids() and loaded.spans() == memory.spans()
    torch.testing.assert_close(loaded.stacked("values", 2), memory.stacked("values", 2))


def test_missing_tensors_name_the_backend_need():
    memory = LatentMemory(Fragment(0, "", torch.tensor([1]), torch.zeros(1)), [])
    with pytest.raises(ValueError, match="'states'"):
        memory.stacked("states", 1)


def saved_dict(memory):
    from methods.memory import FILE_FORMAT, FILE_VERSION, _as_dict
    return {"format": FILE_FORMAT, "version": FILE_VERSION, "sink": _as_dict(memory.sink),
            "fragments": [_as_dict(f) for f in memory.fragments]}


def broken_shapes(data):
    data["fragments"][1]["values"] = data["fragments"][1]["values"][:, :1]     # one head instead of two
    return data


def another_width(data):
    data["fragments"][2]["keys"] = torch.randn(L, KV, 2, D + 1)
    data["fragments"][2]["values"] = torch.randn(L, KV, 2, D + 1)
    return data


@pytest.mark.parametrize("write, fault", [
    (lambda path, memory: path.write_text("fragments: not a memory\n"), "not a memory saved by LatentMemory.save"),
    (lambda path, memory: path.write_bytes(b""), "not a memory saved by LatentMemory.save"),
    (lambda path, memory: (memory.save(path), path.write_bytes(path.read_bytes()[:200])),
     "not a memory saved by LatentMemory.save"),
    (lambda path, memory: torch.save({**saved_dict(memory), "version": 99}, path), "format version 99"),
    (lambda path, memory: torch.save({"sink": None, "fragments": []}, path), "no memdefrag format mark"),
    (lambda path, memory: torch.save(broken_shapes(saved_dict(memory)), path), "values differ across fragments"),
    (lambda path, memory: torch.save(another_width(saved_dict(memory)), path), "keys differ across fragments"),
    (lambda path, memory: torch.save({**saved_dict(memory), "fragments": [{"fid": 0}]}, path), "fragment 0: fields"),
])
def test_load_names_the_file_and_what_is_wrong(memory, tmp_path, write, fault):
    from methods.memory import MemoryFileError
    path = tmp_path / "m.pt"
    write(path, memory)
    with pytest.raises(MemoryFileError, match=fault) as caught:
        LatentMemory.load(path)
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_a_failure_mid_save_leaves_the_old_file_intact(memory, tmp_path, monkeypatch):
    path = tmp_path / "m.pt"
    memory.save(path)
    before = path.read_bytes()

    def half_then_fail(obj, target):
        open(target, "wb").write(b"half a memo")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        LatentMemory(memory.sink, memory.fragments[:1]).save(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["m.pt"]


def test_layers_of_different_shapes_keep_their_own_select_and_round_trip(tmp_path):
    """Keys whose heads and width differ by layer (Gemma-4's global layers) are kept per group of layers:
    selecting, per-layer eviction and save/load act on every group as on one tensor."""
    from methods.memory import Layered

    groups, g = [[0, 2], [1]], torch.Generator().manual_seed(0)

    def layered(length):
        per_layer = [torch.randn(KV if i != 1 else 1, length, D if i != 1 else 2 * D, generator=g) for i in range(L)]
        return per_layer, Layered.of(per_layer, groups)

    (per_keys, keys), (per_values, values) = layered(5), layered(5)
    frag = Fragment(0, "t", torch.arange(5), torch.rand(5), keys=keys, values=values)
    assert len(frag.keys) == L and frag.num_layers == L
    positions = torch.tensor([[0, 3], [1, 4], [2, 3]])                    # each layer its own
    taken = frag.take(positions)
    for layer in range(L):
        group = next(i for i, members in enumerate(groups) if layer in members)
        row = groups[group].index(layer)
        torch.testing.assert_close(taken.keys.parts[group][row], per_keys[layer][:, positions[layer]])
    memory = LatentMemory(frag.take(torch.arange(1)), [frag, frag.take(torch.arange(2))])
    memory.save(tmp_path / "m.pt")
    loaded = LatentMemory.load(tmp_path / "m.pt")
    for a, b in zip(loaded.fragments, memory.fragments):
        assert a.keys.layers == b.keys.layers
        for x, y in zip(a.keys.parts + a.values.parts, b.keys.parts + b.values.parts):
            assert torch.equal(x, y)



def test_a_memory_kept_on_the_host_answers_as_one_kept_where_the_model_is(llama, tokenizer):
    """On a CPU both residences are host memory: the same tensors, the same answer (the GPU tier checks pinning)."""
    from methods.memdefrag import MemDefrag
    from methods.session import Session
    from methods.backends.kv_prefix import KVPrefixBackend
    from tests.conftest import FRAGMENTS

    answers = []
    for where in ("model", "host"):
        session = Session(llama, tokenizer, KVPrefixBackend(llama), MemDefrag(2, 1, "mean"), "shared_sink", "plain", 8,
                          memory_on=where)
        for text in FRAGMENTS:
            session.store(text)
        answers.append(session.ask("where is the cat?"))
    assert answers[0].text == answers[1].text and answers[0].densities == answers[1].densities
