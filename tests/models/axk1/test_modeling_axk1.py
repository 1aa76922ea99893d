import os
import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.models.axk1 import modeling_axk1 as upstream_modeling

from transformers_static import AutoModelForCausalLM, StaticCache
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.axk1.configuration_axk1 import AXK1Config
from transformers_static.models.axk1.modeling_axk1 import AXK1MLP, AXK1ForCausalLM, AXK1MoE

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

SWITCHES = dict(
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=2,
    n_routed_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,  # the best 2 of 4 groups of 2 experts
    routed_scaling_factor=1.5,
    norm_topk_prob=True,
    mlp_layer_types=["sparse", "dense", "sparse"],
    kv_lora_rank=16,
    q_lora_rank=20,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=12,  # v_head_dim != qk_nope_head_dim
    attention_bias=True,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=2,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
PLAIN = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=2,
    n_shared_experts=1,
    n_routed_experts=6,
    num_experts_per_tok=3,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=False,
    first_k_dense_replace=1,  # legacy fields: dense, dense, sparse (layer 1 is not a multiple of 2)
    moe_layer_freq=2,
    kv_lora_rank=12,
    q_lora_rank=8,
    qk_rope_head_dim=4,
    qk_nope_head_dim=12,
    v_head_dim=8,
    rope_interleave=False,
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    initializer_range=0.3,
)


class RandomAXK1ForCausalLM(transformers.AXK1ForCausalLM):
    """Upstream's model with random biases, RMSNorm weights (the MoE output norm among them) and score correction
    biases (upstream initialises them to zero, one and zero)."""

    def __init__(self, config: transformers.AXK1Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if isinstance(module, upstream_modeling.AXK1TopkRouter):
                    module.e_score_correction_bias.normal_(std=0.3)


class AXK1ParityTest(CausalLMParityTests, unittest.TestCase):
    """mlp_layer_types sparse, dense, sparse (the MoE output through post_mlp_layernorm); YaRN with mscale_all_dim,
    interleaved rope; top-2 of 8 in the best 2 of 4 groups, renormalised, scaled by 1.5, two shared experts; biases
    on q_a/kv_a/o."""

    upstream_model_class = RandomAXK1ForCausalLM
    upstream_config_class = transformers.AXK1Config
    config_kwargs = SWITCHES

    def logits(self, model: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids).logits

    def test_layers_and_checkpoint_keys_are_upstream_s(self) -> None:
        """The MoE output norm only on sparse layers, saved at the decoder layer's level as upstream saves it."""
        model = self.models["sdpa"]
        self.assertEqual([type(layer.mlp) for layer in model.model.layers], [AXK1MoE, AXK1MLP, AXK1MoE])
        self.assertEqual(
            [hasattr(layer.mlp, "post_mlp_layernorm") for layer in model.model.layers], [True, False, True]
        )
        saved = load_file(os.path.join(self.tmpdir, "model.safetensors"))
        ours = set(model.state_dict())
        self.assertIn("model.layers.0.post_mlp_layernorm.weight", saved)
        self.assertEqual({k for k in ours if "post_mlp" in k}, {k for k in saved if "post_mlp" in k})

    def test_post_mlp_layernorm_matters(self) -> None:
        model = AXK1ForCausalLM.from_pretrained(self.tmpdir)
        base = self.logits(model)
        for index in (0, 2):
            model.model.layers[index].mlp.post_mlp_layernorm = nn.Identity()
        self.assertGreater((self.logits(model) - base).abs().max().item(), 10 * ATOL)

    def test_cache_holds_only_the_latent_and_the_rope_key(self) -> None:
        config = self.models["sdpa"].config
        cache = StaticCache(config, max_batch_size=2, max_cache_len=16)
        self.assertEqual([tuple(k.shape) for k in cache.key_cache], [(2, 1, 16, 16 + 8)] * 3)
        self.assertEqual(cache.value_cache, [None] * 3)
        held = sum(t.numel() * t.element_size() for t in cache.key_cache)
        theirs = transformers.StaticCache(config=self.upstream.config, max_cache_len=16)
        with torch.no_grad():
            self.upstream(self.input_ids[:2], past_key_values=theirs, use_cache=True)
        upstream_bytes = sum(
            t.numel() * t.element_size() for layer in theirs.layers for t in (layer.keys, layer.values)
        )
        self.assertEqual(held, upstream_bytes)

    def test_router_logits_match_upstream_and_no_aux_loss(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            ours = self.models["sdpa"](self.input_ids, attention_mask=mask_2d, output_router_logits=True)
            self.upstream.set_attn_implementation("sdpa")
            theirs = self.upstream(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d), output_router_logits=True
            )
        self.assertIsNone(ours.aux_loss)
        self.assertEqual(len(ours.router_logits), 2)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)

    def test_a_checkpoint_without_score_correction_biases_loads_them_zero(self) -> None:
        """Upstream leaves a missing `e_score_correction_bias` at its zero init; so does this model (same logits
        as upstream's on that checkpoint); another missing weight is still refused."""
        tensors = load_file(os.path.join(self.tmpdir, "model.safetensors"))
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].config.save_pretrained(out)
            kept = {k: v for k, v in tensors.items() if "e_score_correction_bias" not in k}
            save_file(kept, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
            ours = AutoModelForCausalLM.from_pretrained(out)
            theirs = transformers.AXK1ForCausalLM.from_pretrained(out)
            gate = ours.model.layers[0].mlp.gate
            self.assertEqual(gate.e_score_correction_bias.dtype, torch.float32)
            self.assertTrue(bool((gate.e_score_correction_bias == 0).all()))
            torch.testing.assert_close(self.logits(ours), self.logits(theirs), atol=ATOL, rtol=0)
            kept.pop("model.layers.0.post_mlp_layernorm.weight")
            save_file(kept, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
            with self.assertRaisesRegex(ValueError, "missing 1 weight"):
                AutoModelForCausalLM.from_pretrained(out)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        with self.assertRaisesRegex(ValueError, "AXK1Config declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


class AXK1PlainTest(PlainParityTests, unittest.TestCase):
    """mlp_layer_types from the legacy first_k_dense_replace / moe_layer_freq (dense, dense, sparse), plain default
    rope, one group, top-3 of 6 not renormalised, scaled by 2.5, tied embeddings."""

    upstream_class = RandomAXK1ForCausalLM
    plain_config = PLAIN


class AXK1ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AXK1Config(), transformers.AXK1Config()
        fields = [*transformers.AXK1Config.__annotations__, "qk_head_dim", "head_dim", "num_local_experts"]
        for field in fields:
            if field not in ("num_mtp_layers", "first_k_dense_replace", "base_model_ep_plan"):
                self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        for field in ("norm_topk_prob", "initializer_range", "rope_interleave", "tie_word_embeddings"):
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(ours.mlp_layer_types, ["dense"] + ["sparse"] * 60)

    def test_legacy_layer_fields_and_round_trip(self) -> None:
        ours, theirs = AXK1Config(**PLAIN), transformers.AXK1Config(**PLAIN)
        self.assertEqual(ours.mlp_layer_types, theirs.mlp_layer_types)
        self.assertEqual(ours.mlp_layer_types, ["dense", "dense", "sparse"])
        with tempfile.TemporaryDirectory() as out:
            ours.save_pretrained(out)
            reread = transformers.AXK1Config.from_pretrained(out)
        self.assertEqual((reread.mlp_layer_types, reread.head_dim, reread.q_lora_rank), (ours.mlp_layer_types, 4, 8))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "q_lora_rank=None: A.X-K1's attention always"):
            AXK1Config(**{**PLAIN, "q_lora_rank": None})
        with self.assertRaisesRegex(ValueError, "mlp_layer_types=.* must hold one of"):
            AXK1Config(**{**PLAIN, "mlp_layer_types": ["dense", "sparse"]})
        with self.assertRaisesRegex(ValueError, "num_key_value_heads=1 with num_attention_heads=2"):
            AXK1Config(**{**PLAIN, "num_key_value_heads": 1})
        with self.assertRaisesRegex(ValueError, "partial_rotary_factor=0.5"):
            AXK1Config(**{**PLAIN, "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}})
