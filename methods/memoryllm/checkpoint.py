"""MemoryLLM and M+ checkpoints (Wang et al., 2024, 2025; `YuWangX/memoryllm-8b`, `YuWangX/mplus-8b`) loaded
natively with current transformers.

A MemoryLLM checkpoint is a Llama plus a memory pool: `memory` [L, num_blocks x num_tokens, hidden] (the
per-layer prefix states), `bos_embedding` [L, 1, hidden] (the prefix's first state at every layer),
`new_memory_positional_emb` [1, 1, hidden] (added to the positions whose outputs become new memory) and
`initialized` (whether the pool holds anything yet). Its LoRA adapters (config `lora_config`) are kept as
the authors' peft layout names them (`<proj>.base_layer`, `<proj>.lora_A.<adapter>`, ...), so the state dict
loads as it is: adapter `default` writes memory, `decoder_adapter` (when `add_decoder_lora`) reads it.
An M+ checkpoint (the same model type; its config has `num_ltm_blocks`) keeps `num_blocks - num_ltm_blocks`
blocks in the pool (its short-term memory), a long-term memory per layer (`ltm.<layer>`, its retrieval keys
`ltm_keys`, `ltm_recall_frequencies`, `ltm_ages`) and per layer the retriever's projections
(`self_attn.query_proj`, `key_proj`, `encoder_query_proj`); its pool is always initialized.

Registered with transformers' auto classes for `model_type: memoryllm`, so `harness.models.loading.load` reads such a
checkpoint like any other. The forward is the Llama's own; the memory is applied by `methods.memoryllm.memoryllm`.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.activations import ACT2FN

WRITE_ADAPTER, READ_ADAPTER = "default", "decoder_adapter"


class MemoryLLMConfig(LlamaConfig):
    model_type = "memoryllm"

    def __init__(self, num_tokens: int = 256, num_blocks: int = 50, add_bos_embedding: bool = True,
                 drop_memory_per_layer: bool = False, add_decoder_lora: bool = False,
                 lora_config: dict | None = None, num_ltm_blocks: int = 0, ltm_initial_size: int = 0,
                 update_ltm_mode: str = "immediate", update_ltm_frequency: int = 1, decay_frequency: float = 1,
                 initial_rf_when_moving_stm_to_ltm: float = 1, add_selector: bool = False,
                 selector_layers: list[int] | None = None, selector_hidden_dim: int = 0, num_selector_layers: int = 1,
                 add_encoder_retriever: bool = False, **kwargs):
        self.num_tokens, self.num_blocks = num_tokens, num_blocks
        self.add_bos_embedding, self.drop_memory_per_layer = add_bos_embedding, drop_memory_per_layer
        self.add_decoder_lora, self.lora_config = add_decoder_lora, lora_config
        self.num_ltm_blocks, self.ltm_initial_size = num_ltm_blocks, ltm_initial_size
        self.update_ltm_mode = update_ltm_mode
        self.update_ltm_frequency, self.decay_frequency = update_ltm_frequency, decay_frequency
        self.initial_rf_when_moving_stm_to_ltm = initial_rf_when_moving_stm_to_ltm
        self.add_selector, self.selector_layers = add_selector, selector_layers
        self.selector_hidden_dim, self.num_selector_layers = selector_hidden_dim, num_selector_layers
        self.add_encoder_retriever = add_encoder_retriever
        super().__init__(**kwargs)

    @property
    def stm_slots(self) -> int:
        """The pool's size: M+ keeps `num_ltm_blocks` of its blocks for what it retrieves."""
        return (self.num_blocks - self.num_ltm_blocks) * self.num_tokens


class LoraLinear(nn.Module):
    """A linear layer with named low-rank adapters (peft's layout); the `active` one is added (their
    dropout is a training matter)."""

    def __init__(self, base: nn.Linear, adapters: list[str], rank: int, alpha: float):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.ModuleDict({a: nn.Linear(base.in_features, rank, bias=False) for a in adapters})
        self.lora_B = nn.ModuleDict({a: nn.Linear(rank, base.out_features, bias=False) for a in adapters})
        self.scaling, self.active = alpha / rank, adapters[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B[self.active](self.lora_A[self.active](x)) * self.scaling


class MemoryLLMForCausalLM(LlamaForCausalLM):
    config_class = MemoryLLMConfig

    def __init__(self, config: MemoryLLMConfig):
        super().__init__(config)
        layers, hidden = config.num_hidden_layers, config.hidden_size
        frozen = dict(requires_grad=False)
        self.memory = nn.Parameter(torch.zeros(layers, config.stm_slots, hidden), **frozen)
        self.new_memory_positional_emb = nn.Parameter(torch.zeros(1, 1, hidden), **frozen)
        self.bos_embedding = nn.Parameter(torch.zeros(layers, 1, hidden), **frozen) \
            if config.add_bos_embedding else None
        if not config.num_ltm_blocks:
            self.register_buffer("initialized", torch.tensor(0, dtype=torch.uint8))
        else:
            size = config.ltm_initial_size
            for name, width in (("ltm", (hidden,)), ("ltm_keys", (config.selector_hidden_dim,)),
                                ("ltm_recall_frequencies", ()), ("ltm_ages", ())):
                setattr(self, name, nn.ParameterList(nn.Parameter(torch.zeros(size, *width), **frozen)
                                                     for _ in range(layers)))
            self.add_retrievers(config)
        if config.lora_config:
            adapters = [WRITE_ADAPTER] + ([READ_ADAPTER] if config.add_decoder_lora else [])
            targets = config.lora_config.get("target_modules") or ["q_proj", "v_proj"]
            for layer in self.model.layers:
                for block in (layer.self_attn, layer.mlp):
                    for name in targets:
                        if isinstance(getattr(block, name, None), nn.Linear):
                            setattr(block, name, LoraLinear(getattr(block, name), adapters,
                                                            config.lora_config["r"], config.lora_config["lora_alpha"]))
        self.use_adapter(READ_ADAPTER)

    def add_retrievers(self, config: MemoryLLMConfig) -> None:
        """M+'s retriever projections on the attention of every selector layer (its own layout)."""
        def projector():
            size, act = config.selector_hidden_dim, ACT2FN[config.hidden_act]
            if config.num_selector_layers == 2:
                return nn.Sequential(nn.Linear(config.hidden_size, 2 * size, bias=False), act,
                                     nn.Linear(2 * size, size, bias=False))
            return nn.Linear(config.hidden_size, size, bias=False)

        for index, layer in enumerate(self.model.layers):
            if config.add_selector and (config.selector_layers is None or index in config.selector_layers):
                names = ["query_proj", "key_proj"] + (["encoder_query_proj"] if config.add_encoder_retriever else [])
                for name in names:
                    setattr(layer.self_attn, name, projector())

    @property
    def pool_ready(self) -> bool:
        """Whether the pool holds memory yet (M+'s always does)."""
        return bool(self.config.num_ltm_blocks) or bool(self.initialized)

    def use_adapter(self, name: str) -> None:
        """Make adapter `name` the active one where a layer has it (else the layer's first)."""
        for module in self.modules():
            if isinstance(module, LoraLinear):
                module.active = name if name in module.lora_A else next(iter(module.lora_A))

    @contextmanager
    def writing(self):
        """The adapter that writes memory, for the duration of an injection."""
        self.use_adapter(WRITE_ADAPTER)
        try:
            yield
        finally:
            self.use_adapter(READ_ADAPTER)


AutoConfig.register(MemoryLLMConfig.model_type, MemoryLLMConfig, exist_ok=True)
AutoModelForCausalLM.register(MemoryLLMConfig, MemoryLLMForCausalLM, exist_ok=True)
