"""The memory a question holds, term by term (docs/gpu.md): what stays live between questions and the transients
of each phase (a question, an update that evicts, forming a fragment, the first job's self-check), so that a
peak on a GPU can be foreseen and a measured one explained. tests/test_peak.py holds the live terms to the tensors
found alive after a question."""

from __future__ import annotations

from dataclasses import dataclass

from methods.formation import nll_rows

INDEX_BYTES = 8 + 4        # per stored token: its id (int64) and its self-information (fp32)


@dataclass(frozen=True)
class Dims:
    """What a decoder's size in memory depends on: layers L, key/value heads kv, head width d, hidden width h,
    MLP width m, vocabulary V."""

    L: int
    kv: int
    d: int
    h: int
    m: int
    V: int

    @classmethod
    def of(cls, config) -> "Dims":
        c = config.get_text_config()
        d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(c.num_hidden_layers, c.num_key_value_heads, d, c.hidden_size, c.intermediate_size, c.vocab_size)


def terms(dims: Dims, weight_bytes: int, b: int, memory_tokens: int, view_tokens: int, prompt_tokens: int,
          answer_tokens: int, tracer_layer: int, fragment_tokens: int, backend: str = "fast",
          formed_bytes: int = 0) -> dict[str, int]:
    """Bytes per term for a Top-K question on the model's device. b: bytes per value of the model's dtype;
    memory_tokens N: stored positions (the sink included); view_tokens: the K selected fragments' (the sink
    included); fragment_tokens: one formed fragment's; formed_bytes: the formed-fragment cache, on the host.
    Live between questions: weights, memory (keys and values; the layer inputs instead under hidden_prefix),
    the fast backend's trace until the next store: its placed memory up to the tracer layer and its rows.
    Transients: the placed view and one layer's working set (a question); a fragment's old and kept positions side
    by side as forgetting cuts it (an update that evicts: one fragment at a time, the trace forgotten first,
    methods/backends/kv_prefix.py); a fragment's forward (formation); the weights upcast to fp32 (the
    self-check, in the first job's window, memory still empty); hidden_prefix's stacked copy of the states."""
    kv_token = 2 * dims.L * dims.kv * dims.d * b
    fast = backend == "fast"
    stored_token = kv_token if fast else dims.L * dims.h * b         # hidden_prefix keeps every layer's input
    n, p, a, f = memory_tokens, prompt_tokens, answer_tokens, fragment_tokens
    traced = tracer_layer + 1
    rows = p * (n + p) * 4                                           # the tracer layer's fp32 rows [p, 1+N+p]
    trace = (n + 2 * p) * 2 * traced * dims.kv * dims.d * b + rows if fast else 0   # room for a prompt twice p
    layer_work = p * (2 * dims.h + 3 * dims.m) * b + dims.V * 4
    unrotated_keys = dims.L * dims.kv * dims.d * b if fast else 0    # each layer's keys as its rotation was given them
    return {"weights": weight_bytes, "memory": n * (stored_token + INDEX_BYTES), "trace": trace,
            "formed_host": formed_bytes,
            "view": (view_tokens + p + a) * kv_token + layer_work,
            "hidden_prefix_copy": 0 if fast else n * stored_token + (n + p) * 2 * traced * dims.kv * dims.d * b,
            "eviction": f * stored_token,
            "formation": f * (2 * stored_token + unrotated_keys + (2 * dims.h + 3 * dims.m) * b + dims.V * b)
                         + self_information(dims.V, b, f),
            "selfcheck_fp32": weight_bytes * (4 - b) // b}


def self_information(vocabulary: int, b: int, fragment_tokens: int) -> int:
    """What next_token_nll holds beside the logits: a few positions' fp32 log-probabilities, and their upcast where
    the logits are narrower than fp32."""
    return min(fragment_tokens, nll_rows(vocabulary)) * vocabulary * (4 if b >= 4 else 8)


def live(t: dict[str, int]) -> int:
    """On the device between questions (the formed-fragment cache is on the host)."""
    return t["weights"] + t["memory"] + t["trace"]


def peak(t: dict[str, int]) -> int:
    """The most any phase holds: a question (hidden_prefix stacks its states then), an update that evicts and
    forms a fragment (without the trace, which a store forgets first: methods/session.py), or the self-check
    (weights in fp32, no memory yet; before a job's peak window opens: harness/running/runner.py)."""
    return max(live(t) + t["view"] + t["hidden_prefix_copy"], update(t), t["weights"] + t["selfcheck_fp32"])


def update(t: dict[str, int]) -> int:
    """An update that evicts: the weights, the memory, a fragment cut and one formed."""
    return t["weights"] + t["memory"] + t["eviction"] + t["formation"]
