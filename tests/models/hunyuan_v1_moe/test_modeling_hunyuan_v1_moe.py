import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.hunyuan_v1_moe.configuration_hunyuan_v1_moe import HunYuanMoEV1Config
from transformers_static.models.hunyuan_v1_moe.modeling_hunyuan_v1_moe import HunYuanMoEV1ForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

# What Hunyuan checkpoints state: "dynamic" with a fixed alpha (NTK-alpha), extra YaRN-style keys unused.
NTK_ALPHA = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0}
PER_LAYER = dict(
    hidden_size=32,
    intermediate_size=24,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    attention_bias=True,
    num_experts=8,  # a decode step of 3 rows picks at most 9 of 8: gathered on the top-1 and top-2 layers
    moe_topk=[2, 3, 1],  # one per layer, as the Hub checkpoints give it
    rope_scaling=NTK_ALPHA,
    rope_theta=10000.0,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
ONE_TOP_K = dict(
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=8,
    num_experts=6,
    moe_topk=4,  # dense in decode too
    tie_word_embeddings=True,
    initializer_range=0.3,
)
# Hunyuan-A13B-Instruct's config.json fields that upstream's config does not know (its values, per layer)
HUB_EXTRAS = dict(
    num_shared_expert=[1] * 3,
    use_mixed_mlp_moe=True,
    moe_intermediate_size=[24] * 3,
    use_qk_norm=True,
    use_cla=False,
    cla_share_factor=2,
    moe_drop_tokens=False,
    moe_random_routing_dropped_token=False,
)


class RandomHunYuanMoEV1ForCausalLM(transformers.HunYuanMoEV1ForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one, which
    would not tell a missing bias or a query norm swapped with the key norm)."""

    def __init__(self, config: transformers.HunYuanMoEV1Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class HunYuanMoEV1ParityTest(CausalLMParityTests, unittest.TestCase):
    """Top-2, top-3 and top-1 of 8 experts on three layers (moe_topk as a list), the shared MLP, NTK-alpha rotary,
    per-head query/key norms after the rotation, biased attention, head_dim 16 with hidden_size 32; the Hub's
    extra fields at the values upstream's fixed architecture has."""

    upstream_model_class = RandomHunYuanMoEV1ForCausalLM
    upstream_config_class = transformers.HunYuanMoEV1Config
    config_kwargs = {**PER_LAYER, **HUB_EXTRAS}

    def logits(self, model: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids).logits

    def test_top_k_per_layer_is_upstream_s_and_matters(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual([layer.mlp.gate.top_k for layer in model.model.layers], [2, 3, 1])
        self.assertEqual([layer.mlp.gate.top_k for layer in self.upstream.model.layers], [2, 3, 1])
        everywhere_two = HunYuanMoEV1ForCausalLM.from_pretrained(self.tmpdir, moe_topk=2)
        self.assertGreater((self.logits(everywhere_two) - self.logits(model)).abs().max().item(), 10 * ATOL)

    def test_router_logits_match_upstream_and_no_aux_loss(self) -> None:
        """One float32 `[batch * q_len, experts]` per layer; upstream computes no load-balancing loss for this model,
        so `aux_loss` is None and the loss is the LM loss, as upstream's."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 3)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            self.assertEqual(mine.dtype, torch.float32)
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        self.assertIsNone(ours.aux_loss)
        self.assertIsNone(theirs.aux_loss)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_shared_mlp_matters(self) -> None:
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        expected = self.logits(model)
        with torch.no_grad():
            model.model.layers[1].mlp.shared_mlp.down_proj.weight.zero_()
        self.assertGreater((self.logits(model) - expected).abs().max().item(), 10 * ATOL)

    def test_checkpoint_layout_and_float32_router(self) -> None:
        """Upstream's saved names (`mlp.gate.wg.weight`, experts one matrix each); in bfloat16 the router weight
        stays float32, as upstream builds it, and the router is no linear layer that int8 would quantize."""
        saved = load_file(f"{self.tmpdir}/model.safetensors")
        self.assertIn("model.layers.2.mlp.gate.wg.weight", saved)
        self.assertIn("model.layers.2.mlp.experts.7.up_proj.weight", saved)
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            self.assertEqual(set(load_file(f"{out}/model.safetensors")), set(saved))
        ours = AutoModelForCausalLM.from_pretrained(self.tmpdir, dtype=torch.bfloat16)
        theirs = transformers.HunYuanMoEV1ForCausalLM.from_pretrained(self.tmpdir, dtype=torch.bfloat16)
        wg, expected = ours.model.layers[0].mlp.gate.wg.weight, theirs.model.layers[0].mlp.gate.wg.weight
        self.assertEqual((wg.dtype, expected.dtype), (torch.float32, torch.float32))
        self.assertEqual(ours.model.layers[0].mlp.experts.gate_up_proj.dtype, torch.bfloat16)
        self.assertNotIsInstance(ours.model.layers[0].mlp.gate.wg, nn.Linear)


class HunYuanMoEV1OneTopKParityTest(PlainParityTests, unittest.TestCase):
    """Top-4 of 6 on every layer (dense in decode too), default rotary, no biases, one key/value head, tied
    embeddings, no Hub extras."""

    upstream_class = RandomHunYuanMoEV1ForCausalLM
    plain_config = ONE_TOP_K


class HunYuanMoEV1ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = HunYuanMoEV1Config(), transformers.HunYuanMoEV1Config()
        for field in transformers.HunYuanMoEV1Config.__annotations__:
            if field != "head_dim":
                self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_experts_per_tok, ours.num_local_experts, ours.sep_token_id), (1, 1, 4))
        self.assertEqual(ours.head_dim, 4096 // 32)  # upstream keeps None (and cannot build the model from it)

    def test_hub_config_reads_as_upstream(self) -> None:
        """Hunyuan-A13B-Instruct's config.json, its extra fields kept as given."""
        hub = dict(
            architectures=["HunYuanMoEV1ForCausalLM"],
            model_type="hunyuan_v1_moe",
            hidden_size=4096,
            intermediate_size=3072,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            num_experts=64,
            moe_topk=[8] * 32,
            num_shared_expert=[1] * 32,
            moe_intermediate_size=[3072] * 32,
            use_mixed_mlp_moe=True,
            use_qk_norm=True,
            use_cla=False,
            max_position_embeddings=32768,
            rope_scaling={
                "alpha": 1000.0,
                "beta_fast": 32,
                "beta_slow": 1,
                "factor": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "type": "dynamic",
            },
            rope_theta=10000.0,
            vocab_size=128167,
            eod_token_id=127967,
            torch_dtype="bfloat16",
            tie_word_embeddings=True,
        )
        ours = HunYuanMoEV1Config.from_dict(hub)
        theirs = transformers.HunYuanMoEV1Config.from_dict(hub)
        for field in transformers.HunYuanMoEV1Config.__annotations__:
            if field != "rope_parameters":
                self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(ours.rope_parameters["alpha"], 1000.0)
        self.assertEqual((ours.layer_top_k(5), ours.num_shared_expert, ours.dtype), (8, [1] * 32, torch.bfloat16))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            HunYuanMoEV1Config(**PER_LAYER, **HUB_EXTRAS).save_pretrained(out)
            theirs = transformers.HunYuanMoEV1Config.from_pretrained(out)
            ours = AutoConfig.from_pretrained(out)
        self.assertEqual((theirs.num_experts, theirs.moe_topk, theirs.head_dim), (8, [2, 3, 1], 16))
        self.assertEqual((ours.moe_topk, ours.use_mixed_mlp_moe), ([2, 3, 1], True))
        with tempfile.TemporaryDirectory() as out:
            transformers.HunYuanMoEV1Config(**ONE_TOP_K).save_pretrained(out)
            ours = HunYuanMoEV1Config.from_pretrained(out)
        self.assertEqual((ours.num_experts, ours.moe_topk, ours.tie_word_embeddings), (6, 4, True))

    def test_other_architectures_are_refused_by_name(self) -> None:
        """Fields upstream ignores while building one fixed model: any other value is a ValueError naming it."""
        base = dict(intermediate_size=24, num_hidden_layers=3, num_experts=8)
        refused = {
            "num_shared_expert": [1, 2, 1],
            "use_mixed_mlp_moe": False,
            "moe_intermediate_size": [24, 24, 12],
            "use_qk_norm": False,
            "use_cla": True,
        }
        for field, value in refused.items():
            with self.assertRaisesRegex(ValueError, f"^{field}=.* is not supported"):
                HunYuanMoEV1Config(**base, **{field: value})
        with self.assertRaisesRegex(ValueError, "num_experts must be one positive int"):
            HunYuanMoEV1Config(**{**base, "num_experts": [8, 8, 8]})
        with self.assertRaisesRegex(ValueError, "moe_topk must be an int between 1 and num_experts \\(8\\)"):
            HunYuanMoEV1Config(**base, moe_topk=[2, 2])
        with self.assertRaisesRegex(ValueError, "moe_topk must be"):
            HunYuanMoEV1Config(**base, moe_topk=9)
        self.assertEqual(HunYuanMoEV1Config(**base, num_shared_expert=1, moe_intermediate_size=24).num_experts, 8)
