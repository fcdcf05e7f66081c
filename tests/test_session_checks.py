"""A library user's session refuses what the runner's preflight would, in one line, before any forward: its parts,
and a memory handed to it that it would not have formed (tests/test_bad_input.py holds the command line's)."""

import pytest

from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.compression.compressor import Compression
from methods.backends.kv_prefix import KVPrefixBackend
from methods.baselines import TextMemory, Vanilla
from methods.forgetting import CapacityError, Informativeness, RandomLayerwise
from methods.memory import LatentMemory
from methods.session import Session
from methods.window import Window
from tests.conftest import FRAGMENTS, tiny_model


def session(model, tokenizer, method=None, backend=KVPrefixBackend, **kwargs):
    kwargs = {"formation": "shared_sink", "prompt": "plain", "max_new_tokens": 4, **kwargs}
    return Session(model, tokenizer, backend(model), method or Vanilla(), **kwargs)


def stored(model, tokenizer, **kwargs) -> Session:
    made = session(model, tokenizer, **kwargs)
    made.store_all(FRAGMENTS[:3])
    return made


PARTS = {
    "a method class": (dict(method=Vanilla), TypeError, "Session: method must be an instance, not the class Vanilla "
                                                        "itself (make one: Vanilla(...))"),
    "a forgetting class": (dict(forgetting=Informativeness), TypeError, "Session: forgetting must be an instance, not "
                                                                        "the class Informativeness itself"),
    "a window of a number": (dict(window=512), TypeError, "Session: window must be a Window or NoneType, not int"),
    "no answer budget": (dict(max_new_tokens=0), ValueError, "max_new_tokens=0 must be an integer >= 1"),
    "a budget of a fraction": (dict(max_new_tokens=2.5), ValueError, "max_new_tokens=2.5 must be an integer >= 1"),
    "a misspelt prompt": (dict(prompt="Chat"), ValueError, "prompt='Chat' is not one of ['chat', 'plain', 'raw']"),
    "text memory forgetting per layer": (dict(method=TextMemory(), forgetting=RandomLayerwise(50)), ValueError,
                                         "forgetting RandomLayerwise drops different tokens at every layer; method "
                                         "TextMemory has no layers"),
}


@pytest.mark.parametrize("case", sorted(PARTS))
def test_a_session_made_of_a_wrong_part_is_one_line(case, llama, tokenizer):
    kwargs, error, said = PARTS[case]
    with pytest.raises(error) as raised:
        session(llama, tokenizer, **kwargs)
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_a_backend_built_on_another_model_or_not_built_is_refused(llama, tokenizer):
    other = tiny_model("llama", num_hidden_layers=5)
    for backend in (KVPrefixBackend(other), KVPrefixBackend):
        with pytest.raises(ValueError, match="is not built on this session's model: pass KVPrefixBackend"):
            Session(llama, tokenizer, backend, Vanilla(), "shared_sink", "plain")


def test_the_fast_backend_refuses_in_a_session_what_it_refuses_in_a_run(tokenizer):
    """A rotary table that changes with a forward's length: refused as the runner refuses it, pointing to the
    hidden-prefix backend, which takes it."""
    model = tiny_model("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="^KVPrefixBackend places stored keys by one rotary table; .* use "
                                         "HiddenPrefixBackend"):
        session(model, tokenizer)
    session(model, tokenizer, backend=HiddenPrefixBackend)


def test_an_answer_budget_asked_for_is_checked_not_replaced(llama, tokenizer):
    made = stored(llama, tokenizer)
    with pytest.raises(ValueError, match="max_new_tokens=0 must be an integer >= 1"):
        made.ask("where did the cat sit?", max_new_tokens=0)
    assert made.ask("where did the cat sit?", max_new_tokens=2).tokens <= 2


def test_store_all_of_one_string_is_refused_not_stored_letter_by_letter(llama, tokenizer):
    made = session(llama, tokenizer)
    with pytest.raises(TypeError, match="texts must be an iterable of str, not one str"):
        made.store_all("the cat sat on the mat")
    assert len(made.memory) == 0


def test_a_memory_formed_by_another_model_or_formation_is_refused_naming_both(llama, tokenizer):
    deeper = stored(tiny_model("llama", num_hidden_layers=5), tokenizer).memory
    with pytest.raises(ValueError, match=r"this memory was formed by a llama model \(5 layers, hidden \d+, "
                                         r"vocabulary \d+, float32\), formation shared_sink; this session forms by a "
                                         r"llama model \(\d layers"):
        session(llama, tokenizer).memory = deeper
    with pytest.raises(ValueError, match="formation own_bos; this session forms by .* formation shared_sink"):
        session(llama, tokenizer).memory = stored(llama, tokenizer, formation="own_bos").memory
    with pytest.raises(ValueError, match="formed by a gemma2 model"):
        session(llama, tokenizer).memory = stored(tiny_model("gemma2"), tokenizer).memory


def test_a_memory_lacking_what_the_session_reads_is_refused(llama, tokenizer):
    fast = stored(llama, tokenizer).memory
    with pytest.raises(ValueError, match="formed without 'states', which this session's backend reads"):
        session(llama, tokenizer, backend=HiddenPrefixBackend).memory = fast
    with pytest.raises(ValueError, match="this memory has no self-information"):
        session(llama, tokenizer, forgetting=Informativeness(200)).memory = fast
    with pytest.raises(TypeError, match="Session.memory must be a LatentMemory, not NoneType"):
        session(llama, tokenizer).memory = None


def test_a_memory_handed_over_or_loaded_is_read_and_grown_with_ids_of_its_own(llama, tokenizer, tmp_path):
    """The documented pattern (one session stores, another reads the same memory): it answers as the first
    session does, the ids it stores next follow the memory's, and a saved memory keeps what formed it."""
    first = stored(llama, tokenizer)
    first.memory.save(tmp_path / "memory.pt")
    loaded = LatentMemory.load(tmp_path / "memory.pt")
    assert loaded.formed_by == first.memory.formed_by is not None
    reader = session(llama, tokenizer)
    reader.memory = loaded
    assert reader.ask("where did the cat sit?").text == first.ask("where did the cat sit?").text
    assert reader.store("one more fragment") == 3 and reader.memory.ids() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="formed by a llama model .* this session forms by a llama model .5 layers"):
        session(tiny_model("llama", num_hidden_layers=5), tokenizer).memory = LatentMemory.load(tmp_path / "memory.pt")


def test_a_first_store_that_fails_leaves_no_memory_to_ask(llama, tokenizer):
    made = session(llama, tokenizer, forgetting=Informativeness(3), window=Window(None))
    with pytest.raises(CapacityError):
        made.store("a much longer fragment that crosses the capacity")
    assert made.memory.sink is None
    with pytest.raises(ValueError, match="nothing is stored yet for Vanilla to read"):
        made.ask("where did the cat sit?")


def test_a_memory_forgotten_per_layer_has_no_text_to_read(llama, tokenizer):
    made = stored(llama, tokenizer, forgetting=RandomLayerwise(30))
    assert made.memory.fragments[0].token_ids.dim() == 2
    with pytest.raises(ValueError, match="layers keep different tokens .* read it with a latent method"):
        made.memory.text_ids()


def test_a_question_that_reads_no_token_is_one_line(llama, tokenizer):
    with pytest.raises(ValueError, match="Session.ask: the question '' in prompt 'raw' reads no token"):
        stored(llama, tokenizer).ask("", prompt="raw")


class Returns(Compression):
    """A compressor that returns what it is given, whatever the text."""

    def __init__(self, kept):
        super().__init__()
        self.kept = kept

    def compress(self, text, model, tokenizer):
        return self.kept


@pytest.mark.parametrize("kept", [[10**6], [-1], [], "the text", [1.5], list(range(40))])
def test_a_compressor_returning_what_no_fragment_can_be_formed_of_is_one_line(kept, llama, tokenizer):
    made = session(llama, tokenizer, compressor=Returns(kept))
    with pytest.raises(ValueError, match=r"^compression Returns returned .* for a text of 22 tokens: it must return a "
                                         r"non-empty list of at most 22 token ids in 0\.\.\d+ \(or None"):
        made.store(FRAGMENTS[0])
    assert made.memory.sink is None


def test_a_memory_of_the_same_model_elsewhere_and_one_formed_to_be_forgotten_are_taken(llama, tokenizer):
    """The stamp is the model's kind and shape, not its path (another machine's cache); a memory formed under
    informativeness forgetting, some of whose fragments hold no finite self-information (one token left, its
    first under the reference formation), serves a session that forgets by it."""
    first = session(llama, tokenizer, formation="reference", forgetting=Informativeness(70))
    first.store_all(FRAGMENTS)
    assert any(bool(f.self_info.isinf().all()) for f in first.memory.fragments)
    other = tiny_model("llama")
    other.config.name_or_path = "/elsewhere/the-same-model"
    reader = session(other, tokenizer, formation="reference", forgetting=Informativeness(70))
    reader.memory = first.memory
    assert reader.store("one more fragment") == len(FRAGMENTS)


def test_a_part_need_not_subclass_its_kind(llama, tokenizer):
    """contracts.py's kinds are members, not base classes: a forgetting written from scratch serves a session."""
    class KeepsAll:
        capacity, layerwise, needs_self_info = None, False, False

        def admit(self, memory, fragment):
            memory.append(fragment)
            return 0

    made = session(llama, tokenizer, forgetting=KeepsAll())
    made.store_all(FRAGMENTS[:2])
    assert made.memory.ids() == [0, 1]
