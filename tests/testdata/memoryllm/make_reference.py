"""Remakes reference.pt with the authors' MemoryLLM and M+ code (not part of this project).

Run it in an environment of the reference's own pins, from this folder:
    python -m venv refenv
    refenv/bin/pip install torch==2.13.0 transformers==4.48.2 safetensors accelerate==1.2.0 peft==0.14.0
    git clone https://github.com/wangyu-ustc/MemoryLLM    (main, commit 5acaf52)
    refenv/bin/python make_reference.py MemoryLLM
For each variant of tiny.py it builds the authors' model from the config and fills its weights as tiny.py
does (the test builds this project's model the same way, so no weights are stored), and saves the config, the
state dict's names and shapes (the layout this project must load), and with torch's global seed fixed (the
random drops draw from it) the memory after each injection and the logits of a question read over it.
MemoryLLM (`plain`, `lora`): two injections, from the pool as filled (initialized, like the released
checkpoints) and from an empty pool (the first injection fills it). M+ (`mplus`): three injections (the second
merges the cache of dropped slots into the long-term memory, the third leaves one waiting), the long-term
memory's size after each, and a question that retrieves from both. Two shims, neither changing a number: the
reference's eager attention returns 4 values where its M+ decoder layer takes 5 (its authors run flash
attention, which needs a GPU), so the missing retriever output (None) is added; and numpy's argsort, with
which it orders retrieved entries by age, is made stable: its default sort leaves equal ages (common: every
slot of the initial pool has age 0) in an order that depends on the CPU's sort kernel, so the data would
depend on the machine.
"""

import sys

import torch

sys.path.insert(0, sys.argv[1])
from configuration_memoryllm import MemoryLLMConfig  # noqa: E402
import modeling_mplus  # noqa: E402
import numpy as np  # noqa: E402
from modeling_memoryllm import MemoryLLM  # noqa: E402
from tiny import VARIANTS, fill  # noqa: E402

eager = modeling_mplus.LlamaAttention.forward
modeling_mplus.LlamaAttention.forward = lambda self, *args, **kwargs: (*eager(self, *args, **kwargs), None)
unstable = np.argsort
np.argsort = lambda values, *args, **kwargs: unstable(values, *args, **{**kwargs, "kind": "stable"})

torch.manual_seed(0)
contexts = [torch.randint(3, 128, (1, 12)), torch.randint(3, 128, (1, 20))]
question = torch.randint(3, 128, (1, 6))
third = torch.randint(3, 128, (1, 10))
saved = {"contexts": [c[0] for c in contexts], "question": question[0], "seed": 1234}


def built(variant: str, model_class, attention: str):
    """The authors' model of `variant`, filled; its config and state-dict layout recorded."""
    model = fill(model_class(MemoryLLMConfig(**VARIANTS[variant], attn_implementation=attention)))
    saved[f"{variant}/config"] = model.config.to_dict()
    saved[f"{variant}/layout"] = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    return model


for variant in ("plain", "lora"):
    for start in ("initialized", "empty"):
        model = built(variant, MemoryLLM, "sdpa")
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
model = built("mplus", modeling_mplus.MPlus, "eager")
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
