"""The tiny MemoryLLM and M+ checkpoints of the reference test, as configs and a deterministic fill of their
weights: make_reference.py (the authors' classes, their environment) and tests/test_memoryllm.py (this
project's) build the same models from these, so no weights are stored, only the reference's outputs.
Needs nothing but torch."""

import torch

SHAPE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, num_tokens=8, num_blocks=4,
             add_bos_embedding=True, bos_token_id=1, eos_token_id=2)
LORA = {"inference_mode": False, "r": 4, "lora_alpha": 8, "lora_dropout": 0.1,
        "target_modules": ["q_proj", "v_proj", "k_proj", "up_proj", "down_proj", "gate_proj"]}
# plain: one drop for all layers, no LoRA; lora: the 8B training configs' adapters and drop per layer; mplus: the
# M+ training config at a tiny size (4 pool blocks, 2 retrieved long-term blocks, the cache joining the long-term
# memory every 2 injections, two-layer retriever projections)
VARIANTS = {
    "plain": SHAPE,
    "lora": {**SHAPE, "lora_config": LORA, "add_decoder_lora": True, "drop_memory_per_layer": True},
    "mplus": {**SHAPE, "lora_config": LORA, "add_decoder_lora": True, "drop_memory_per_layer": True, "num_blocks": 6,
              "num_ltm_blocks": 2, "update_ltm_mode": "immediate", "update_ltm_frequency": 2, "decay_frequency": 1,
              "initial_rf_when_moving_stm_to_ltm": 10, "ltm_initial_size": 24, "add_selector": True,
              "selector_hidden_dim": 16, "num_selector_layers": 2, "map_from_hidden_states": True,
              "detach_hidden_state": True, "add_encoder_retriever": True},
}


def values(name: str, shape, generator: torch.Generator) -> torch.Tensor:
    """What a state-dict entry holds: its name says what it is (recall frequencies such that some entries
    decay out at the first merge)."""
    if name == "initialized":
        return torch.ones(shape)
    if "ltm_recall_frequencies" in name:
        return torch.rand(shape, generator=generator) * 3
    if "ltm_ages" in name:
        return torch.randint(0, 50, shape, generator=generator).float()
    normal = torch.randn(shape, generator=generator)
    if name.endswith("norm.weight"):
        return 1 + 0.1 * normal
    if name.split(".")[0] in ("memory", "bos_embedding", "ltm", "ltm_keys"):
        return normal
    return (0.2 if "lora_" in name else 0.1) * normal


@torch.no_grad()
def fill(model: torch.nn.Module) -> torch.nn.Module:
    """Every state-dict entry, in name order, from one generator seeded 0."""
    generator = torch.Generator().manual_seed(0)
    for name, tensor in sorted(model.state_dict().items()):
        tensor.copy_(values(name, tensor.shape, generator))
    return model.eval()
