"""Remakes reference.pt and tiny/ with the authors' MemoryLLM code (not part of this project).

Run it in an environment of the reference's own pins, from this folder:
    python -m venv refenv && refenv/bin/pip install torch==2.13.0 transformers==4.48.2 safetensors accelerate==1.2.0
    git clone https://github.com/wangyu-ustc/MemoryLLM  (commit 5acaf52)
    refenv/bin/python make_reference.py MemoryLLM
It builds a tiny random MemoryLLM checkpoint from a config (saved to tiny/), injects two contexts with
torch's global seed fixed (the random drop draws from it), and saves the memory after each injection and
the logits of a question read over the memory, for two starts: the pool as saved (initialized, like the
released checkpoints) and an empty pool (the first injection fills it).
"""

import sys

import torch

sys.path.insert(0, sys.argv[1])
from configuration_memoryllm import MemoryLLMConfig  # noqa: E402
from modeling_memoryllm import MemoryLLM  # noqa: E402

torch.manual_seed(0)
config = MemoryLLMConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_theta=10000.0, num_tokens=8, num_blocks=4, add_bos_embedding=True,
                         bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
model = MemoryLLM(config).eval()
model.initialized.fill_(1)
model.save_pretrained("tiny")

contexts = [torch.randint(3, 128, (1, 12)), torch.randint(3, 128, (1, 20))]
question = torch.randint(3, 128, (1, 6))
saved = {"contexts": [c[0] for c in contexts], "question": question[0], "seed": 1234}
for start in ("initialized", "empty"):
    model = MemoryLLM.from_pretrained("tiny", attn_implementation="sdpa").eval()
    if start == "empty":
        model.initialized.fill_(0)
    torch.manual_seed(1234)
    memories = []
    with torch.no_grad():
        for context in contexts:
            model.inject_memory(context, update_memory=True)
            memories.append(model.memory.detach().clone())
        logits = model(input_ids=question).logits[0]
    saved[start] = {"memories": memories, "logits": logits}
torch.save(saved, "reference.pt")
print({k: [m.shape for m in v["memories"]] for k, v in saved.items() if isinstance(v, dict)})
