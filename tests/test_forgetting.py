"""Bounded memory: quota arithmetic, which tokens leave, and that backends stay equivalent."""

import random

import pytest
import torch

from methods.forgetting import (CapacityError, Informativeness, RandomForgetting, RandomLayerwise,
                                proportional_quotas)
from methods.formation import Former
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.memory import Fragment, LatentMemory
from methods.attention.tracing import densities
from tests.conftest import FRAGMENTS

LAYERS = 3


def test_quotas_on_many_random_cases():
    rng = random.Random(0)
    for _ in range(2000):
        lengths = [rng.randint(0, 600) for _ in range(rng.randint(1, 40))]
        total = rng.randint(0, sum(lengths))
        quotas = proportional_quotas(lengths, total)
        assert sum(quotas) == total
        assert all(0 <= q <= n for q, n in zip(quotas, lengths))
        if sum(lengths):
            assert all(abs(q - total * n / sum(lengths)) < 1 for q, n in zip(quotas, lengths))


def test_quotas_give_the_remainder_to_the_largest_fractions():
    assert proportional_quotas([10, 20, 30], 6) == [1, 2, 3]
    assert proportional_quotas([1, 1, 1], 2) == [1, 1, 0]           # equal fractions: earlier first
    assert proportional_quotas([3, 5], 3) == [1, 2]                  # 1.125 / 1.875
    with pytest.raises(ValueError, match="cannot evict 9 tokens"):
        proportional_quotas([3, 5], 9)


def tagged(fid: int, length: int) -> Fragment:
    """A fragment whose every stored number says (layer, original position): 1000 * layer + position."""
    position = torch.arange(length, dtype=torch.float)
    layer = 1000 * torch.arange(LAYERS, dtype=torch.float).view(-1, 1)
    code = layer + position                                              # [L, T]
    return Fragment(fid, f"f{fid}", token_ids=torch.arange(length) + 100 * fid,
                    self_info=torch.rand(length, generator=torch.Generator().manual_seed(fid)),
                    keys=code[:, None, :, None].repeat(1, 2, 1, 4), values=-code[:, None, :, None].repeat(1, 2, 1, 4),
                    states=code[:, :, None].repeat(1, 1, 8))


def tagged_memory(lengths) -> LatentMemory:
    return LatentMemory(tagged(99, 1), [tagged(i, n) for i, n in enumerate(lengths)])


def origins(fragment: Fragment) -> torch.Tensor:
    """The original position held at each retained slot, per layer [L, T], from every stored tensor alike."""
    from_keys = fragment.keys[:, 0, :, 0] - 1000 * torch.arange(LAYERS).view(-1, 1)
    torch.testing.assert_close(fragment.values[:, 1, :, 3], -fragment.keys[:, 1, :, 3])
    torch.testing.assert_close(fragment.states[:, :, 5], fragment.keys[:, 0, :, 0])
    return from_keys.long()


def test_informativeness_drops_the_lowest_self_information_at_every_layer():
    memory = tagged_memory([40, 20])
    original = [f.self_info.clone() for f in memory.fragments]
    Informativeness(capacity=1000).evict(memory, 15)                     # quotas 10 and 5
    for frag, info in zip(memory.fragments, original):
        kept = origins(frag)
        assert (kept == kept[0]).all()                                    # the same positions at every layer
        dropped = sorted(set(range(len(info))) - set(kept[0].tolist()))
        assert len(dropped) == {40: 10, 20: 5}[len(info)]
        assert info[dropped].max() <= info[kept[0]].min()                 # the least informative left
        torch.testing.assert_close(frag.self_info, info[kept[0]])        # self-information travels
        assert frag.token_ids.tolist() == (kept[0] + 100 * frag.fid).tolist()


def test_self_information_stays_that_of_the_original_token_over_repeated_evictions():
    memory = tagged_memory([50])
    info = memory.fragments[0].self_info.clone()
    forgetting = Informativeness(capacity=1000)
    for total in (10, 10, 10):
        forgetting.evict(memory, total)
    kept = origins(memory.fragments[0])[0]
    assert len(kept) == 20 and torch.equal(kept, info.argsort(stable=True)[30:].sort().values)
    torch.testing.assert_close(memory.fragments[0].self_info, info[kept])


def test_random_forgetting_is_coherent_and_layerwise_is_not():
    memory = tagged_memory([60, 30])
    RandomForgetting(capacity=1000, seed=3).evict(memory, 30)
    kept = origins(memory.fragments[0])
    assert kept.shape == (LAYERS, 40) and (kept == kept[0]).all()
    memory = tagged_memory([60, 30])
    RandomLayerwise(capacity=1000, seed=3).evict(memory, 30)
    for frag, n in zip(memory.fragments, (40, 20)):
        kept = origins(frag)
        assert kept.shape == (LAYERS, n) and len(frag) == n               # same length at every layer
        assert (kept.diff(dim=1) > 0).all()                               # order kept within each layer
        assert frag.token_ids.shape == (LAYERS, n)
        assert torch.equal(frag.token_ids, kept + 100 * frag.fid)        # ids follow each layer's tokens
    assert not (origins(memory.fragments[0]) == origins(memory.fragments[0])[0]).all()


def test_capacity_evicts_exactly_the_excess_then_appends():
    memory = tagged_memory([30, 20])
    forgetting = Informativeness(capacity=60)
    assert forgetting.admit(memory, tagged(7, 25)) == 15
    assert memory.n_tokens == 60 and [len(f) for f in memory.fragments] == [21, 14, 25]
    assert forgetting.admit(memory, tagged(8, 5)) == 5 and memory.n_tokens == 60
    with pytest.raises(CapacityError, match="fragment of 61 tokens exceeds forgetting.capacity=60"):
        forgetting.admit(memory, tagged(9, 61))


def test_fragments_forgotten_entirely_leave_the_memory():
    memory = tagged_memory([1, 1, 1])
    RandomForgetting(capacity=10).evict(memory, 2)
    assert len(memory) == 1 and memory.n_tokens == 1


def test_random_draws_depend_on_the_group_only():
    base = RandomForgetting(capacity=1000, seed=5)
    draws = []
    for _ in range(2):
        memory = tagged_memory([50])
        base.for_group(4).evict(memory, 20)
        draws.append(origins(memory.fragments[0])[0])
    assert torch.equal(*draws)


@pytest.mark.parametrize("strategy", [Informativeness, RandomForgetting, RandomLayerwise])
def test_forgetting_keeps_the_backends_equivalent(family_model, tokenizer, strategy):
    former = Former(family_model, tokenizer, "shared_sink", keep_kv=True, keep_states=True)
    forgetting = strategy(capacity=90, seed=1)
    memory = LatentMemory()
    for text in FRAGMENTS:
        forgetting.admit(memory, former.next_fragment(memory, text))
    assert memory.n_tokens == 90 and len(memory) == len(FRAGMENTS)
    memory = memory.arranged([3, 0, 4])
    prompt = torch.tensor(tokenizer("where is the cat?", add_special_tokens=False)["input_ids"])
    fast, ref = KVPrefixBackend(family_model), HiddenPrefixBackend(family_model)
    torch.testing.assert_close(fast.prefill(memory, prompt)[0], ref.prefill(memory, prompt)[0], atol=1e-4, rtol=0)
    layer = family_model.config.num_hidden_layers - 1
    fast_rows = fast.attention_rows(memory, prompt, [layer])[layer]
    ref_rows = ref.attention_rows(memory, prompt, [layer])[layer]
    torch.testing.assert_close(densities(fast_rows, memory.spans(), "mean"),
                               densities(ref_rows, memory.spans(), "mean"), atol=1e-5, rtol=0)


def test_formation_runs_the_vocabulary_head_only_when_self_information_is_read(llama, tokenizer):
    """Without a forgetting that reads it, formation skips the head over every token: same states, no
    self-information."""
    texts = FRAGMENTS[:2]
    memories = []
    for keep_self_info in (True, False):
        former = Former(llama, tokenizer, "shared_sink", keep_kv=True, keep_states=True, keep_self_info=keep_self_info)
        memory = LatentMemory()
        for text in texts:
            former.store(memory, text)
        memories.append(memory)
    with_info, without = memories
    for a, b in zip(with_info.fragments, without.fragments):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) and torch.equal(a.states, b.states)
        assert torch.isfinite(a.self_info[1:]).all() and torch.isinf(b.self_info).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_self_information_a_few_positions_at_a_time_is_that_of_all_at_once(dtype, monkeypatch):
    """next_token_nll's log-softmax runs over `nll_rows` positions at a time (docs/gpu.md: all at once held two fp32
    copies of the logits); each row's is its own, so the nats are the very ones of all positions at once."""
    from methods import formation

    vocabulary = 4099
    monkeypatch.setattr(formation, "NLL_BYTES", 7 * 4 * vocabulary)          # 7 positions at a time
    torch.manual_seed(0)
    for tokens in (1, 2, 7, 8, 38):
        logits, ids = (3 * torch.randn(tokens, vocabulary)).to(dtype), torch.randint(0, vocabulary, (tokens,))
        at_once = -torch.log_softmax(logits[:-1].float(), dim=-1).gather(1, ids[1:].view(-1, 1)).squeeze(1)
        assert formation.nll_rows(vocabulary) == 7 and torch.equal(formation.next_token_nll(logits, ids), at_once)
