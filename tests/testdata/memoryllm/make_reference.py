"""Remakes reference.pt and the tiny checkpoints with the authors' MemoryLLM code (not part of this project).

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
"""

import sys

import torch

sys.path.insert(0, sys.argv[1])
from configuration_memoryllm import MemoryLLMConfig  # noqa: E402
from modeling_memoryllm import MemoryLLM  # noqa: E402

SHAPE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, num_tokens=8, num_blocks=4,
             add_bos_embedding=True, bos_token_id=1, eos_token_id=2)
LORA = {"inference_mode": False, "r": 4, "lora_alpha": 8, "lora_dropout": 0.1,
        "target_modules": ["q_proj", "v_proj", "k_proj", "up_proj", "down_proj", "gate_proj"]}
VARIANTS = {"plain": {}, "lora": {"lora_config": LORA, "add_decoder_lora": True, "drop_memory_per_layer": True}}

torch.manual_seed(0)
contexts = [torch.randint(3, 128, (1, 12)), torch.randint(3, 128, (1, 20))]
question = torch.randint(3, 128, (1, 6))
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
torch.save(saved, "reference.pt")
print(sorted(saved))
