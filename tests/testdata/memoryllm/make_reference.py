"""Remakes reference.pt and the tiny checkpoints with the authors' MemoryLLM and M+ code (not part of this project).

Run it in an environment of the reference's own pins, from this folder:
    python -m venv refenv
    refenv/bin/pip install torch==2.13.0 transformers==4.48.2 safetensors accelerate==1.2.0 peft==0.14.0
    git clone https://github.com/wangyu-ustc/MemoryLLM    (main, commit 5acaf52)
    refenv/bin/python make_reference.py MemoryLLM
For each variant it builds a tiny random MemoryLLM checkpoint from a config (saved to tiny_<variant>/),
then, for two starts (the pool as saved, initialized like the released checkpoints; and an empty pool,
which the first injection fills), injects two contexts with torch's global seed fixed (the random drop
draws from it) and saves the memory after each injection and the logits of a question read over it.
Variants: `plain` (one drop for all layers, no LoRA) and `lora` (the 8B training configs' settings:
LoRA adapters for writing and for reading, `add_decoder_lora`, and a drop per layer).
M+ (`mplus`, the M+ training config's settings at a tiny size: 4 pool blocks, 2 retrieved long-term blocks, the
cache joining the long-term memory every 2 injections, two-layer retriever projections): three injections (the
second one merges the cache, the third leaves one waiting), the pool and the long-term memory's size after each,
and the logits of the question, which retrieves from both. Two shims, neither changing a number: the reference's
eager attention returns 4 values where its decoder layer takes 5 (its authors run flash attention, which needs
a GPU), so the missing retriever output (None) is added; and numpy's argsort, with which it orders retrieved
entries by age, is made stable: its default sort leaves equal ages (common: every slot of the initial pool has
age 0) in an order that depends on the CPU's sort kernel, so the data would depend on the machine.
"""

import sys

import torch

sys.path.insert(0, sys.argv[1])
from configuration_memoryllm import MemoryLLMConfig  # noqa: E402
import modeling_mplus  # noqa: E402
import numpy as np  # noqa: E402
from modeling_memoryllm import MemoryLLM  # noqa: E402

eager = modeling_mplus.LlamaAttention.forward
modeling_mplus.LlamaAttention.forward = lambda self, *args, **kwargs: (*eager(self, *args, **kwargs), None)
unstable = np.argsort
np.argsort = lambda values, *args, **kwargs: unstable(values, *args, **{**kwargs, "kind": "stable"})

SHAPE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, num_tokens=8, num_blocks=4,
             add_bos_embedding=True, bos_token_id=1, eos_token_id=2)
LORA = {"inference_mode": False, "r": 4, "lora_alpha": 8, "lora_dropout": 0.1,
        "target_modules": ["q_proj", "v_proj", "k_proj", "up_proj", "down_proj", "gate_proj"]}
VARIANTS = {"plain": {}, "lora": {"lora_config": LORA, "add_decoder_lora": True, "drop_memory_per_layer": True}}

torch.manual_seed(0)
contexts = [torch.randint(3, 128, (1, 12)), torch.randint(3, 128, (1, 20))]
question = torch.randint(3, 128, (1, 6))
third = torch.randint(3, 128, (1, 10))
saved = {"contexts": [c[0] for c in contexts], "question": question[0], "seed": 1234}
for variant, extra in VARIANTS.items():
    model = MemoryLLM(MemoryLLMConfig(**SHAPE, **extra, attn_implementation="sdpa")).eval()
    for name, parameter in model.named_parameters():
        if "lora_" in name:                     # peft starts lora_B at zero: make every adapter count
            parameter.data.normal_(0, 0.2)
    model.initialized.fill_(1)
    model.save_pretrained(f"tiny_{variant}")
    for start in ("initialized", "empty"):
        model = MemoryLLM.from_pretrained(f"tiny_{variant}", attn_implementation="sdpa").eval()
        if start == "empty":
            model.initialized.fill_(0)
        torch.manual_seed(saved["seed"])
        memories = []
        with torch.no_grad():
            for context in contexts:
                model.inject_memory(context, update_memory=True)
                memories.append(model.memory.detach().clone())
            logits = model(input_ids=question).logits[0]
        saved[f"{variant}/{start}"] = {"memories": memories, "logits": logits}
MPLUS = dict(lora_config=LORA, add_decoder_lora=True, drop_memory_per_layer=True, num_blocks=6, num_ltm_blocks=2,
             update_ltm_mode="immediate", update_ltm_frequency=2, decay_frequency=1,
             initial_rf_when_moving_stm_to_ltm=10,
             ltm_initial_size=24, add_selector=True, selector_hidden_dim=16, num_selector_layers=2,
             map_from_hidden_states=True, detach_hidden_state=True, add_encoder_retriever=True)
model = modeling_mplus.MPlus(MemoryLLMConfig(**{**SHAPE, **MPLUS}, attn_implementation="eager")).eval()
for name, parameter in model.named_parameters():
    if "lora_" in name:
        parameter.data.normal_(0, 0.2)
for frequencies, ages in zip(model.ltm_recall_frequencies, model.ltm_ages):   # some leave at the first merge
    frequencies.data.uniform_(0, 3)
    ages.data.copy_(torch.randint(0, 50, ages.shape).float())
model.save_pretrained("tiny_mplus")
model = modeling_mplus.MPlus.from_pretrained("tiny_mplus", attn_implementation="eager").eval()
model.put_ltm_to_numpy()
torch.manual_seed(saved["seed"])
memories, sizes = [], []
with torch.no_grad():
    for context in [*contexts, third]:
        model.inject_memory(context, update_memory=True)
        memories.append(model.memory.detach().clone())
        sizes.append([len(entries) for entries in model.ltm])
    logits = model(input_ids=question).logits[0]
saved["mplus"] = {"third": third[0], "memories": memories, "long_term_sizes": sizes, "logits": logits}
torch.save(saved, "reference.pt")
print(sorted(saved))
