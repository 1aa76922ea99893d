"""Mixture of experts on static shapes: the expert products of every MoE model here (Mixtral, Qwen-MoE, gpt-oss,
DeepSeek, GLM-4.5, Granite MoE, ...) as one graph for every routing, their routers, their checkpoint layout, the
load-balancing loss, and the causal-LM head that returns both.

A router picks `top_k` of `num_experts` experts per token: that is data. Nothing here turns it into a shape (no
`nonzero`, no per-expert token lists, no host reads), so a compiled step is the same graph whatever the routing.
Two formulations, chosen from static facts (`gathers`):

- gathered, when `tokens * top_k < num_experts` (decode: one token per row): the weights of each token's chosen
  experts are indexed out of the stacked parameters and multiplied with that token alone. A step reads
  `tokens * top_k` experts' weights instead of all of them. Under compile the product is written as a reduction
  over the indexed weights, which inductor generates as one loop that reads the chosen rows in place (as
  `linear_utils` does for one-row products); eagerly, the indexed weights are copied and multiplied in a batch.
- dense (prefill): every expert's product for every token, as one batched matmul per projection over the stacked
  weights, each expert's output weighted by its routing weight (zero where not chosen). Each weight is read once
  and multiplied by `tokens` rows: `num_experts / top_k` times the FLOPs of the routed products, but no weight is
  read twice and no token is dropped. Chosen by measurement (utils/bench_moe.py, 8 experts, top-2, 32 to 512
  tokens): tokens grouped by expert into fixed-capacity slots (two batched products over `[experts, capacity]`)
  stay exact only with a capacity of `tokens` per expert, which multiplies as many rows as dense plus the
  grouping: 0.9x to 1.9x dense's time over four runs, never clearly faster. Twice the mean load as capacity is up
  to 2.2x faster from 128 tokens on, but drops the assignments that overflow it (upstream drops none). Gathering
  per token copies `tokens * top_k` experts' weights: ~30x dense's time at 32 tokens.

Expert weights are stacked `[num_experts, out, in]` (Mixtral, Qwen3-MoE: `gate_up_proj` holds the gate rows then
the up rows) or `[num_experts, in, out]` (gpt-oss, `transposed`), as upstream 5.x stores them, optionally with
biases `[num_experts, out]`, and int8 (quantization/) with per-expert, per-output-channel scales `[num_experts,
out]`. Upstream saves Mixtral's and Qwen3-MoE's experts one matrix per expert (`experts.{e}.w1.weight`, ...), as
their Hub checkpoints hold them: `StackedExperts.checkpoint_parts` declares that layout, and state-dict hooks give
the module's `state_dict()` those keys and stack them again on load, so `from_pretrained`, `save_pretrained` and
tensor-parallel reads see the checkpoint's own names.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from .cache_utils import Cache
from .modeling_causal_lm import CausalLMMixin, causal_lm_loss

# stacked name suffix -> checkpoint name suffix, for the float weight and its int8 scale
_CHECKPOINT_SUFFIXES = (("", ".weight"), ("_scale", ".weight_scale"))


def gathers(tokens: int, top_k: int, num_experts: int) -> bool:
    """Whether `tokens` tokens run the gathered formulation: when their chosen experts (`tokens * top_k` weight
    matrices per projection) are fewer than all of them. A static fact of the shapes, decided while tracing."""
    return tokens * top_k < num_experts


class StackedExperts(nn.Module):
    """A model's experts: `gate_up_proj`, `down_proj` stacked over experts (see the module docstring for layouts),
    with optional biases `gate_up_proj_bias` `[num_experts, 2 * intermediate]` and `down_proj_bias` `[num_experts,
    hidden]`. A subclass creates the parameters and defines `glu` (`[..., 2 * intermediate] -> [..., intermediate]`).

    `int8_layout = "experts"` tells quantization to quantize `stacked_weights` per expert and output channel
    (adding `<name>_scale` parameters, read here when present)."""

    int8_layout: ClassVar[str] = "experts"
    stacked_weights: ClassVar[tuple[str, ...]] = ("gate_up_proj", "down_proj")
    # [num_experts, in, out] instead of [num_experts, out, in]
    transposed: ClassVar[bool] = False
    # Checkpoints that hold one matrix per expert: {stacked name: names of its row blocks}, e.g. {"gate_up_proj":
    # ("w1", "w3")} for `experts.{e}.w1.weight` (gate rows) and `experts.{e}.w3.weight` (up rows). None: stacked.
    checkpoint_parts: ClassVar[dict[str, tuple[str, ...]] | None] = None

    def __init__(self, num_experts: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        for name in ("gate_up_proj_bias", "down_proj_bias"):
            self.register_parameter(name, None)
        for name in self.stacked_weights:
            self.register_parameter(f"{name}_scale", None)
        if self.checkpoint_parts is not None:
            self.register_state_dict_post_hook(_unstack_for_checkpoint)
            self.register_load_state_dict_pre_hook(_stack_from_checkpoint)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must define glu")

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """`hidden_states` `[tokens, hidden]`, each token's chosen experts `top_k_index` `[tokens, top_k]` and their
        weights `top_k_weights` -> `[tokens, hidden]`: the weighted sum of the chosen experts' outputs."""
        tokens, top_k = top_k_index.shape
        if gathers(tokens, top_k, self.num_experts):
            return self._gathered(hidden_states, top_k_index, top_k_weights)
        return self._dense(hidden_states, top_k_index, top_k_weights)

    def _projection(self, name: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return getattr(self, name), getattr(self, f"{name}_scale"), getattr(self, f"{name}_bias")

    def _gathered(self, hidden_states: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        x = hidden_states[:, None, :].expand(-1, index.shape[1], -1)  # [tokens, top_k, hidden]
        gate_up = gathered_product(x, *self._projection("gate_up_proj"), index, self.transposed)
        out = gathered_product(self.glu(gate_up), *self._projection("down_proj"), index, self.transposed)
        weighted = (out * weights[..., None]).to(hidden_states.dtype)  # [tokens, top_k, hidden]
        return weighted.sum(1)

    def _dense(self, hidden_states: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        gate_up = dense_product(hidden_states, *self._projection("gate_up_proj"), self.transposed)
        out = dense_product(self.glu(gate_up), *self._projection("down_proj"), self.transposed)  # [E, tokens, hidden]
        return weighted_dense_sum(out, index, weights, hidden_states.dtype)


def gathered_product(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    index: torch.Tensor,
    transposed: bool,
) -> torch.Tensor:
    """`x` `[tokens, top_k, in]` times each row's own expert `weight[index]` (`[E, out, in]`, or `[E, in, out]` when
    `transposed`; int8 with `scale` `[E, out]`), plus `bias[index]` -> `[tokens, top_k, out]` in `x`'s dtype.

    Under compile: a float32 reduction over `in` that indexes the stacked weight itself (read in place, in its own
    dtype); eagerly: the chosen matrices copied out (`index_select`: 4x faster than advanced indexing here) and
    multiplied per row (`einsum`: 5x faster than a batched matmul of one-column matrices)."""
    if torch.compiler.is_compiling():
        chosen = weight[index]  # [tokens, top_k, out, in] or [tokens, top_k, in, out]
        if transposed:
            y = (x[..., :, None].float() * chosen.float()).sum(-2)
        else:
            y = (x[..., None, :].float() * chosen.float()).sum(-1)
        if scale is not None:
            y = y * scale[index].float()
        if bias is not None:
            y = y + bias[index].float()
        return y.to(x.dtype)
    chosen = weight.index_select(0, index.reshape(-1)).view(*index.shape, *weight.shape[1:]).to(x.dtype)
    y = torch.einsum("tkio,tki->tko" if transposed else "tkoi,tki->tko", chosen, x)  # [tokens, top_k, out]
    if scale is not None:
        y = y * scale[index].to(x.dtype)
    return y if bias is None else y + bias[index].to(x.dtype)


def weighted_dense_sum(
    out: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Every expert's output `out` `[E, tokens, hidden]` weighted by each token's routing weights (`index` /
    `weights` `[tokens, top_k]`; zero for the experts it did not choose), cast to `dtype`, summed -> `[tokens,
    hidden]`."""
    num_experts, tokens = out.shape[:2]
    chosen = torch.zeros(tokens, num_experts, dtype=torch.bool, device=index.device)
    chosen = chosen.scatter(1, index, True).T[..., None]  # [E, tokens, 1]
    routing = torch.zeros(tokens, num_experts, dtype=weights.dtype, device=weights.device)
    routing = routing.scatter(1, index, weights).T[..., None]  # [E, tokens, 1]
    # `where`, not a product by zero: an expert a token did not choose may overflow in half precision
    return torch.where(chosen, out * routing, 0).to(dtype).sum(0)


def dense_product(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None, transposed: bool
) -> torch.Tensor:
    """`x` `[tokens, in]` (every expert's input the same) or `[E, tokens, in]` times every expert's `weight` (layouts
    as `gathered_product`), plus `bias` -> `[E, tokens, out]` in `x`'s dtype: one batched matmul."""
    stacked = weight.to(x.dtype)
    y = torch.matmul(x, stacked if transposed else stacked.transpose(-1, -2))  # [E, tokens, out]
    if scale is not None:
        y = y * scale[:, None, :].to(x.dtype)
    return y if bias is None else y + bias[:, None, :].to(x.dtype)


# ---------------------------------------------------------------------- checkpoint layout
def _unstack_for_checkpoint(module: StackedExperts, state_dict: dict[str, Any], prefix: str, metadata: Any) -> None:
    """state_dict post-hook: each stacked tensor (and its int8 scale) as one tensor per expert and row block."""
    for name, parts in module.checkpoint_parts.items():
        for stacked_suffix, checkpoint_suffix in _CHECKPOINT_SUFFIXES:
            stacked = state_dict.pop(f"{prefix}{name}{stacked_suffix}", None)
            if stacked is None:
                continue
            for expert in range(stacked.shape[0]):
                for part, block in zip(parts, stacked[expert].chunk(len(parts)), strict=True):
                    state_dict[f"{prefix}{expert}.{part}{checkpoint_suffix}"] = block


def _stack_from_checkpoint(module: StackedExperts, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: the per-expert tensors of a checkpoint stacked under the module's names (pieces
    missing from the checkpoint are left for the loader to report)."""
    for name, parts in module.checkpoint_parts.items():
        for stacked_suffix, checkpoint_suffix in _CHECKPOINT_SUFFIXES:
            keys = [
                [f"{prefix}{expert}.{part}{checkpoint_suffix}" for part in parts]
                for expert in range(module.num_experts)
            ]
            if not all(key in state_dict for row in keys for key in row):
                continue
            blocks = [torch.cat([state_dict.pop(key) for key in row]) for row in keys]
            state_dict[f"{prefix}{name}{stacked_suffix}"] = torch.stack(blocks)


def rename_in_checkpoint(module: nn.Module, name: str, checkpoint_name: str) -> None:
    """Save and load `module`'s child `name` under `checkpoint_name` (Mixtral: `mlp` is `block_sparse_moe` in its
    checkpoints). Hooks on the parent, which sees the child's keys under either name."""
    module.register_state_dict_post_hook(functools.partial(_rename_keys, old=f"{name}.", new=f"{checkpoint_name}."))
    module.register_load_state_dict_pre_hook(
        functools.partial(_rename_keys, old=f"{checkpoint_name}.", new=f"{name}.")
    )


def rename_tensor_in_checkpoint(module: nn.Module, name: str, checkpoint_name: str) -> None:
    """Save and load `module`'s tensor `name` as `checkpoint_name` (GraniteMoe: `experts.gate_up_proj` is
    `input_linear.weight` in its checkpoints), and its int8 scale `<name>_scale` as `<checkpoint_name>_scale`."""
    module.register_state_dict_post_hook(functools.partial(_rename_keys, old=name, new=checkpoint_name))
    module.register_load_state_dict_pre_hook(functools.partial(_rename_keys, old=checkpoint_name, new=name))


def _rename_keys(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any, old: str, new: str) -> None:
    for key in [k for k in state_dict if k.startswith(prefix + old)]:
        state_dict[prefix + new + key.removeprefix(prefix + old)] = state_dict.pop(key)


# ---------------------------------------------------------------------- router outputs and the auxiliary loss
def load_balancing_loss(
    router_logits: tuple[torch.Tensor, ...], num_experts: int, top_k: int, padding_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Switch Transformer's auxiliary loss, as upstream's `load_balancing_loss_func`: over all layers' router logits
    (`[tokens, num_experts]` each, tokens batch-major), `num_experts * sum_e f_e * P_e` with `f_e` the share of
    top-k assignments to expert e and `P_e` its mean router probability, both over the real tokens of
    `padding_mask` `[batch, q_len]` (1 = real; None: every token)."""
    device = router_logits[0].device
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probability_sums = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    for logits in router_logits:
        real = (
            torch.ones(logits.shape[0], dtype=torch.float32, device=device)
            if padding_mask is None
            else padding_mask.reshape(-1).to(device=device, dtype=torch.float32)
        )  # [tokens]
        probabilities = F.softmax(logits.to(device), dim=-1)
        _, chosen = torch.topk(probabilities, top_k, dim=-1)  # [tokens, top_k]
        counts = counts + (F.one_hot(chosen, num_experts).float() * real[:, None, None]).sum((0, 1))
        probability_sums = probability_sums + (probabilities.float() * real[:, None]).sum(0)
        rows = rows + real.sum()
    return num_experts * torch.sum((counts / rows) * (probability_sums / rows))


@dataclass
class MoeModelOutputWithPast:
    last_hidden_state: torch.Tensor  # [batch, q_len, hidden]
    past_key_values: Cache | None = None
    router_logits: tuple[torch.Tensor, ...] | None = None  # per sparse layer: [batch * q_len, num_experts]


@dataclass
class MoeCausalLMOutputWithPast:
    logits: torch.Tensor  # [batch, q_len, vocab]
    past_key_values: Cache | None = None
    loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    router_logits: tuple[torch.Tensor, ...] | None = None


class MoeCausalLMMixin(CausalLMMixin):
    """`CausalLMMixin` for sparse models: with `output_router_logits` (default: the config's) the base model's router
    logits are returned with the auxiliary loss, and `router_aux_loss_coef` times it joins the loss when `labels`
    are given, as upstream. The aux loss skips the padding of a 2D `attention_mask` (its last q_len columns are
    the queries'); given a 4D mask (or a dict of them), it counts every token. A model whose upstream head computes
    no auxiliary loss (DeepSeek-V3 and its router family: GLM-4.5, dots1; HunYuan-MoE) sets `router_aux_loss = False`: its
    router logits are still returned, `aux_loss` is None and the loss the language-model loss alone. The head's
    `scale_logits` hook applies as in `CausalLMMixin` (GraniteMoe divides by `logits_scaling`), before the loss."""

    config: Any
    router_aux_loss: ClassVar[bool] = True

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache_position: torch.Tensor | None = None,
        use_cache: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        output_router_logits: bool | None = None,
    ) -> MoeCausalLMOutputWithPast:
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        outputs = getattr(self, self.base_model_prefix)(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
            inputs_embeds=inputs_embeds,
            output_router_logits=output_router_logits,
        )
        logits = self.scale_logits(self.lm_head(outputs.last_hidden_state[:, -logits_to_keep:]))
        loss = causal_lm_loss(logits, labels) if labels is not None else None
        aux_loss = None
        if output_router_logits and self.router_aux_loss:
            q_len = outputs.last_hidden_state.shape[1]
            padding = attention_mask[:, -q_len:] if _is_2d(attention_mask) else None
            top_k = self.config.num_experts_per_tok
            aux_loss = load_balancing_loss(outputs.router_logits, self.config.num_local_experts, top_k, padding)
            if loss is not None:
                loss = loss + self.config.router_aux_loss_coef * aux_loss.to(loss.device)
        return MoeCausalLMOutputWithPast(
            logits=logits,
            past_key_values=outputs.past_key_values,
            loss=loss,
            aux_loss=aux_loss,
            router_logits=outputs.router_logits,
        )


def _is_2d(attention_mask: Any) -> bool:
    return isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2


def softmax_top_k(router_logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixtral's and Qwen3-MoE's choice: softmax over all experts in float32, the `top_k` largest probabilities
    `[tokens, top_k]` (float32) and their experts, renormalised to sum to 1 when `normalize`."""
    probabilities = F.softmax(router_logits.float(), dim=-1)  # [tokens, num_experts]
    weights, index = torch.topk(probabilities, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, index


def grouped_top_k(
    scores: torch.Tensor,
    top_k: int,
    *,
    n_group: int = 1,
    topk_group: int = 1,
    group_score: str = "top2_sum",
    correction_bias: torch.Tensor | None = None,
    normalize: bool = False,
    scaling: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's choice (V2's `group_limited_greedy`, V3's `noaux_tc`, and GLM-4.5, dots1, EXAONE-MoE, ... which
    copy V3's): `scores` `[tokens, num_experts]` (float32 sigmoid or softmax of the router logits), experts split
    into `n_group` equal groups, each group scored by its best expert (`"max"`, V2) or the sum of its best two
    (`"top2_sum"`, V3) of `scores + correction_bias`, the best `topk_group` groups kept, and the `top_k` best
    experts of those chosen by the same biased scores. Returns their unbiased scores `[tokens, top_k]` (divided by
    their sum plus 1e-20 when `normalize`, then times `scaling`) and their experts. Fixed shapes: a group is
    dropped by masking, never by indexing."""
    tokens, num_experts = scores.shape
    if num_experts % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(
            f"{num_experts} experts cannot be split into n_group={n_group} groups of which topk_group={topk_group}"
            " are kept: n_group must divide the experts and topk_group be between 1 and n_group"
        )
    if top_k > topk_group * (num_experts // n_group):
        raise ValueError(
            f"num_experts_per_tok ({top_k}) exceeds the {topk_group * (num_experts // n_group)} experts that"
            f" topk_group={topk_group} of n_group={n_group} groups hold"
        )
    if group_score not in ("top2_sum", "max"):
        raise ValueError(f"group_score must be 'top2_sum' or 'max', not {group_score!r}")
    choice = scores if correction_bias is None else scores + correction_bias.float()  # [tokens, num_experts]
    if topk_group < n_group:
        grouped = choice.view(tokens, n_group, num_experts // n_group)
        best = (
            grouped.amax(-1) if group_score == "max" else grouped.topk(2, dim=-1).values.sum(-1)
        )  # [tokens, n_group]
        kept = torch.zeros_like(best, dtype=torch.bool).scatter(1, best.topk(topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~kept.repeat_interleave(num_experts // n_group, dim=1), float("-inf"))
    index = choice.topk(top_k, dim=-1).indices  # [tokens, top_k]
    weights = scores.gather(1, index)
    if normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, index
