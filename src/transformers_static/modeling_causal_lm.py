"""The causal language-model head every `*ForCausalLM` shares: base model, `lm_head`, loss, and generation."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from .cache_utils import Cache
from .generation import GenerationMixin
from .modeling_outputs import CausalLMOutputWithPast


class CausalLMMixin(GenerationMixin):
    """The language-model head's forward: base model (at `base_model_prefix`), `lm_head`, optional loss.

    Listed before the architecture's PreTrainedModel in a `*ForCausalLM`'s bases. What differs between models is a
    hook, never an overridden forward: `extra_model_inputs` (keyword inputs of the base model beyond the common ones,
    passed through) and `scale_logits` (scaled or capped logits, which the loss then sees, as upstream's)."""

    lm_head: nn.Linear
    base_model_prefix: str
    extra_model_inputs: ClassVar[tuple[str, ...]] = ()  # e.g. Gemma 4's ("per_layer_inputs",)

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
        **model_inputs: torch.Tensor | None,
    ) -> CausalLMOutputWithPast:
        """Logits `[batch, q_len, vocab]` (the last `logits_to_keep` positions only, when > 0) and the loss
        when `labels` are given. `model_inputs`: the model's `extra_model_inputs`, for its base model."""
        unknown = sorted(set(model_inputs) - set(self.extra_model_inputs))
        if unknown:
            raise TypeError(f"{type(self).__name__}.forward() got unexpected keyword arguments {unknown}")
        outputs = getattr(self, self.base_model_prefix)(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
            inputs_embeds=inputs_embeds,
            **model_inputs,
        )
        logits = self.scale_logits(self.lm_head(outputs.last_hidden_state[:, -logits_to_keep:]))
        loss = causal_lm_loss(logits, labels) if labels is not None else None
        return CausalLMOutputWithPast(logits=logits, past_key_values=outputs.past_key_values, loss=loss)

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's logits `[batch, q_len, vocab]` as the model returns them (a hook: identity here). Kept out of
        `lm_head`, a plain linear layer, so int8 quantization and tensor parallelism treat it as any other head."""
        return logits


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in float32; labels of -100 are ignored."""
    shifted = logits[:, :-1].float().reshape(-1, logits.shape[-1])  # [batch * (q_len - 1), vocab]
    targets = labels[:, 1:].reshape(-1).to(logits.device)
    return F.cross_entropy(shifted, targets, ignore_index=-100)
