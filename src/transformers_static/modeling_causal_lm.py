"""The causal language-model head every `*ForCausalLM` shares: base model, `lm_head`, loss, and generation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .cache_utils import Cache
from .generation import GenerationMixin
from .modeling_outputs import CausalLMOutputWithPast


class CausalLMMixin(GenerationMixin):
    """The language-model head's forward: base model (at `base_model_prefix`), `lm_head`, optional loss.

    Listed before the architecture's PreTrainedModel in a `*ForCausalLM`'s bases."""

    lm_head: nn.Linear
    base_model_prefix: str

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache_position: torch.Tensor | None = None,
        use_cache: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> CausalLMOutputWithPast:
        """Logits `[batch, q_len, vocab]` (the last `logits_to_keep` positions only, when > 0) and the loss
        when `labels` are given."""
        outputs = getattr(self, self.base_model_prefix)(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
            inputs_embeds=inputs_embeds,
        )
        logits = self.lm_head(outputs.last_hidden_state[:, -logits_to_keep:])
        loss = causal_lm_loss(logits, labels) if labels is not None else None
        return CausalLMOutputWithPast(logits=logits, past_key_values=outputs.past_key_values, loss=loss)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in float32; labels of -100 are ignored."""
    shifted = logits[:, :-1].float().reshape(-1, logits.shape[-1])  # [batch * (q_len - 1), vocab]
    targets = labels[:, 1:].reshape(-1).to(logits.device)
    return F.cross_entropy(shifted, targets, ignore_index=-100)
