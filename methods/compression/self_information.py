"""Self-information compression (Selective Context at token level, native): keep the `rate` share of a
fragment's tokens that the frozen model itself finds most informative, in their original order.

A token's self-information is -log p(token | the tokens before it in its fragment), the fragment read
behind the same sink token formation uses, so its first token is conditioned too. Ties keep the
earlier token.
"""

from __future__ import annotations

import torch

from methods.compression.compressor import Compressor, kept_count
from methods.formation import next_token_nll, sink_token_id


@torch.no_grad()
def self_information(model, tokenizer, ids: list[int]) -> torch.Tensor:
    """[T] nats of each of `ids`, read after the sink token."""
    tokens = torch.tensor([[sink_token_id(tokenizer), *ids]], device=model.device)
    return next_token_nll(model(input_ids=tokens).logits[0], tokens[0]).cpu()


class SelfInformation(Compressor):
    label = "self_information"

    def positions(self, ids: list[int], model, tokenizer) -> list[int]:
        """The positions of `ids` kept: the rate share of highest self-information, ascending."""
        keep = kept_count(len(ids), self.rate)
        if keep == len(ids):
            return list(range(len(ids)))
        return sorted(torch.sort(-self_information(model, tokenizer, ids), stable=True).indices[:keep].tolist())

    def compress(self, text, model, tokenizer):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return [ids[i] for i in self.positions(ids, model, tokenizer)]
