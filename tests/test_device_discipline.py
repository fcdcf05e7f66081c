"""What a first GPU run would trip on, caught on a CPU: tensors made without their device (read from the source,
and run on a phantom second device, tests/phantom.py), a host memory whose stored tensors are not the pinned
ones, and attention logits rounded to a half-precision model's dtype before densities are read from them."""

import ast
from pathlib import Path

import pytest
import torch
from torch.utils.weak import WeakIdKeyDictionary

from evals.probe import Probe
from methods.attention import tracing
from methods.attention.tracing import densities
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.baselines import Vanilla
from methods.forgetting import Informativeness, RandomLayerwise
from methods.memory import parts
from methods.session import Session
from tests.conftest import FRAGMENTS, tiny_model
from tests.phantom import PhantomDevice
from tests.test_probe import GROUP

ROOT = Path(__file__).resolve().parents[1]
FACTORIES = {"arange", "zeros", "ones", "empty", "full", "tensor", "as_tensor", "eye", "linspace", "logspace",
             "rand", "randn", "randint", "randperm"}
# A factory may leave its device unnamed only where the device is named otherwise: a draw from a generator
# takes the generator's (the project's are host generators, so draws do not depend on the device), a pinned
# tensor is a host one, and a module's parameters and buffers follow the default device that transformers sets
# while it builds a model (meta, or the target device): naming one there would defeat it.
NAMED_OTHERWISE = {"generator", "pin_memory"}
MODULE_STATE = {"Parameter", "register_buffer"}


def device_less_factories(folder: str) -> list[str]:
    """file:line of every `torch.<factory>(...)` under `folder` that names no device (see NAMED_OTHERWISE)."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text())
        module_state = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
                        and getattr(node.func, "attr", getattr(node.func, "id", None)) in MODULE_STATE
                        for arg in node.args}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch" \
                    and not {"device", *NAMED_OTHERWISE} & {k.arg for k in node.keywords} \
                    and id(node) not in module_state:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


@pytest.mark.parametrize("folder", ["methods", "harness"])
def test_every_tensor_factory_names_its_device(folder):
    """A factory given no device makes a CPU tensor wherever the model is; host ones say device="cpu"."""
    assert device_less_factories(folder) == []


def session_on(model, tokenizer, backend, memory_on="model", forgetting=None):
    return Session(model, tokenizer, backend(model), Vanilla(), "shared_sink", "plain", max_new_tokens=4,
                   memory_on=memory_on, forgetting=forgetting)


@pytest.mark.parametrize("memory_on", ["model", "host"])
@pytest.mark.parametrize("backend", [KVPrefixBackend, HiddenPrefixBackend])
def test_the_probe_runs_with_the_model_on_another_device(backend, memory_on, llama, tokenizer):
    """The probe's trace and ranks (tracer-sweep, LoCoMo's trace_layers read the same) with the model on a
    device of its own and the memory there or on the host: the ranks are those of a run on one device."""
    expected = list(Probe("synthetic", fragments=4).run_group(session_on(llama, tokenizer, backend), GROUP))
    with PhantomDevice(llama):
        records = list(Probe("synthetic", fragments=4).run_group(
            session_on(llama, tokenizer, backend, memory_on=memory_on), GROUP))
    assert [r["ranks"] for r in records] == [r["ranks"] for r in expected]


@pytest.fixture
def pinning(monkeypatch):
    """A CUDA machine's pinning, observed on a CPU: pin_memory gives a copy marked pinned, is_pinned reads the
    mark. Yields the marks."""
    marked = WeakIdKeyDictionary()

    def pin(t, *args, **kwargs):
        out = t.clone()
        marked[out] = True
        return out

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t, *args, **kwargs: t in marked)
    return marked


@pytest.mark.parametrize("forgetting", [Informativeness(80), RandomLayerwise(80)], ids=["informativeness",
                                                                                       "random_layerwise"])
@pytest.mark.parametrize("family, backend", [("llama", KVPrefixBackend), ("gemma4_wide", KVPrefixBackend),
                                             ("llama", HiddenPrefixBackend)])
def test_a_host_memory_keeps_its_stored_tensors_pinned(family, backend, forgetting, pinning, tokenizer):
    """memory_on=host: after formation (stacked per layer, or per group of layers of one shape) and after every
    eviction, each stored tensor is itself a pinned one, so placing it on the GPU can overlap compute."""
    session = session_on(tiny_model(family), tokenizer, backend, memory_on="host", forgetting=forgetting)
    for text in FRAGMENTS:
        session.store(text)
        stored = [p for f in [session.memory.sink, *session.memory.fragments]
                  for t in (f.keys, f.values, f.states) if t is not None for p in parts(t)]
        assert stored and all(p.device.type == "cpu" and p.is_pinned() for p in stored)
    assert session.memory.n_tokens <= 80


def test_densities_of_a_bf16_model_are_read_from_fp32_logits(monkeypatch, tokenizer):
    """The tracer scores the model's own bf16 queries and keys in fp32: its rows equal an fp64 computation from
    the same q and k (the logits are made large, as a trained model's are, so that bf16 rounding would show)."""
    model = tiny_model("llama")
    with torch.no_grad():
        model.model.layers[1].self_attn.k_proj.weight.mul_(40)
    model = model.to(torch.bfloat16)
    seen = {}

    def recorded(query, key, attention_mask, scaling=None, softcap=None, sinks=None):
        seen.update(query=query, key=key, mask=attention_mask, scaling=scaling)
        return probabilities(query, key, attention_mask, scaling, softcap, sinks)

    probabilities = tracing.prompt_probabilities
    monkeypatch.setattr(tracing, "prompt_probabilities", recorded)
    session = session_on(model, tokenizer, KVPrefixBackend)
    for text in FRAGMENTS[:4]:
        session.store(text)
    prompt = session.prompt_ids("where is the cat?")
    rows = session.trace(session.memory, prompt, [1])[1]
    query, key = seen["query"].double(), seen["key"].double()
    key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
    logits = query @ key.transpose(2, 3) * (seen["scaling"] or query.shape[-1] ** -0.5)
    q_len, kv_len = logits.shape[-2:]
    assert seen["mask"] is None or seen["mask"].dtype == torch.bool
    visible = torch.ones(q_len, q_len, dtype=torch.bool).tril() if seen["mask"] is None else None
    if visible is None:
        logits = logits.masked_fill(~seen["mask"][..., -kv_len:], float("-inf"))
    else:
        logits[..., kv_len - q_len:] = logits[..., kv_len - q_len:].masked_fill(~visible, float("-inf"))
    expected = torch.softmax(logits, dim=-1).mean(dim=1)[0]
    assert logits[torch.isfinite(logits)].abs().max() > 4                     # logits bf16 would round visibly
    spans = session.memory.spans()
    for mode in ("last", "mean"):
        torch.testing.assert_close(densities(rows, spans, mode).double(), densities(expected, spans, mode),
                                   atol=1e-6, rtol=0)
