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
