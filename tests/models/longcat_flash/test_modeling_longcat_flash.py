import tempfile
import unittest
from unittest import mock

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from transformers_static import AutoModelForCausalLM, StaticCache
from transformers_static.integrations.tensor_parallel import TensorParallel, load_tensor_parallel
from transformers_static.models.longcat_flash import modeling_longcat_flash
from transformers_static.models.longcat_flash.configuration_longcat_flash import LongcatFlashConfig
from transformers_static.models.longcat_flash.modeling_longcat_flash import LongcatFlashForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

MLA = dict(
    q_lora_rank=16,
    kv_lora_rank=12,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    head_dim=8,
    v_head_dim=6,
)
ZERO_EXPERTS = dict(
    hidden_size=32,
    num_layers=1,  # two attention sublayers, two cache layers (DENSE has two layers: four)
    num_attention_heads=4,
    ffn_hidden_size=24,
    **MLA,
    n_routed_experts=8,  # a decode step of 3 rows picks 6 < 8 routed experts: the gathered formulation
    # 2, not 3: with 3 a bfloat16 near-tie flips one token's choice in ours and not upstream's (at 3.3 of a 6 logit)
    zero_expert_num=2,
    moe_topk=2,
    expert_ffn_hidden_size=16,
    routed_scaling_factor=2.0,
    attention_bias=True,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
DENSE = dict(
    hidden_size=32,
    num_layers=2,
    num_attention_heads=2,
    ffn_hidden_size=16,
    **MLA,
    n_routed_experts=6,
    zero_expert_num=0,
    moe_topk=4,  # 3 rows pick 12 >= 6: dense in decode too
    expert_ffn_hidden_size=16,
    rope_theta=1000.0,
    tie_word_embeddings=True,
    initializer_range=0.3,
)


class RandomLongcatFlashForCausalLM(transformers.LongcatFlashForCausalLM):
    """Upstream's model with random biases, RMSNorm weights and score correction biases (upstream initialises them
    to zero and one, which would hide a missing bias, two norms swapped or the correction bias unused)."""

    def __init__(self, config: transformers.LongcatFlashConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
            for layer in self.model.layers:
                layer.mlp.router.e_score_correction_bias.normal_(std=0.05)


class LongcatFlashParityTest(CausalLMParityTests, unittest.TestCase):
    """Top-2 of 8 routed + 2 identity experts (gathered in decode, dense in prefill), a layer of two latent
    attention sublayers (one layer keeps the matrix cheap: LongCat's layer is two of most models'), attention biases, a value head narrower than the query's, random correction biases."""

    upstream_model_class = RandomLongcatFlashForCausalLM
    upstream_config_class = transformers.LongcatFlashConfig
    config_kwargs = ZERO_EXPERTS

    def logits(self, model: nn.Module) -> torch.Tensor:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            return model(self.input_ids, attention_mask=mask_2d).logits[mask_2d.bool()]

    def test_router_logits_match_upstream_and_no_aux_loss(self) -> None:
        """One float32 `[batch * q_len, routed + identity experts]` per layer, as upstream; no auxiliary loss, the
        loss the language model's alone (upstream computes none)."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 1)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            self.assertEqual(tuple(mine.shape), (3 * SEQ_LEN, 10))
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        self.assertIsNone(ours.aux_loss)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_identity_experts_are_chosen_and_matter(self) -> None:
        """Tokens route to the identity experts (index >= n_routed_experts) here, and their share matters: dropped
        from the sum, the logits move; the correction bias matters too."""
        model = self.models["sdpa"]
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            logits = model(self.input_ids, attention_mask=mask_2d, output_router_logits=True).router_logits
        router = model.model.layers[0].mlp.router
        index = (logits[0].softmax(-1) + router.e_score_correction_bias).topk(2, dim=-1).indices
        self.assertGreater((index >= 8).sum().item(), 0)
        baseline = self.logits(model)
        dropped = LongcatFlashForCausalLM.from_pretrained(self.tmpdir)
        original = modeling_longcat_flash.LongcatFlashExperts.forward

        def without_identity(experts, hidden_states, top_k_index, top_k_weights):
            return original(experts, hidden_states, top_k_index, top_k_weights.masked_fill(top_k_index >= 8, 0))

        with mock.patch.object(modeling_longcat_flash.LongcatFlashExperts, "forward", without_identity):
            self.assertGreater((self.logits(dropped) - baseline).abs().max().item(), 10 * ATOL)
        unbiased = LongcatFlashForCausalLM.from_pretrained(self.tmpdir)
        for layer in unbiased.model.layers:
            layer.mlp.router.e_score_correction_bias.zero_()
        self.assertGreater((self.logits(unbiased) - baseline).abs().max().item(), 10 * ATOL)

    def test_gathered_and_dense_formulations_agree(self) -> None:
        """The same tokens through either formulation (forced by patching the choice), identity experts included."""
        moe = self.models["sdpa"].model.layers[0].mlp
        hidden = torch.randn(1, 12, 32, generator=torch.Generator().manual_seed(3))
        outputs = []
        for gathered in (True, False):
            with mock.patch.object(modeling_longcat_flash, "gathers", return_value=gathered), torch.no_grad():
                outputs.append(moe(hidden)[0])
        torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)

    def test_cache_holds_one_latent_per_token_for_each_sublayer(self) -> None:
        """Two cache layers (one per sublayer) of `[latent | rope key]` (12 + 8) and no values; step decoding through
        it is upstream's full forward."""
        model = self.models["eager"]
        cache = StaticCache(model.config, 3, 16)
        self.assertEqual(len(cache.key_cache), 2)
        self.assertEqual(tuple(cache.key_cache[1].shape), (3, 1, 16, 20))
        self.assertTrue(all(v is None for v in cache.value_cache))
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        steps = []
        with torch.no_grad():
            for start, end in [(0, 4), *((t, t + 1) for t in range(4, SEQ_LEN))]:
                out = model(
                    self.input_ids[:, start:end],
                    attention_mask=mask_2d[:, :end],
                    past_key_values=cache,
                    cache_position=torch.arange(start, end),
                )
                steps.append(out.logits)
        self.assert_close_on_real_tokens(torch.cat(steps, dim=1), self.upstream_logits(mask_2d, "eager"), mask_2d)

    def test_checkpoint_keys_are_upstream_s(self) -> None:
        """Saved per expert as upstream saves: every expert's `gate_proj`/`up_proj` (the identity ones' too),
        the routed ones' `down_proj`; the router's `classifier` and correction bias; two of each sublayer."""
        model = self.models["sdpa"]
        with tempfile.TemporaryDirectory() as out:
            model.save_pretrained(out)
            ours = load_file(f"{out}/model.safetensors")
        theirs = load_file(f"{self.tmpdir}/model.safetensors")
        self.assertEqual(sorted(ours), sorted(theirs))
        self.assertIn("model.layers.0.mlp.experts.9.up_proj.weight", ours)
        self.assertNotIn("model.layers.0.mlp.experts.8.down_proj.weight", ours)
        for key in (
            "mlp.experts.9.gate_proj.weight",
            "mlp.router.e_score_correction_bias",
            "self_attn.1.kv_b_proj.weight",
        ):
            torch.testing.assert_close(ours[f"model.layers.0.{key}"], theirs[f"model.layers.0.{key}"], atol=0, rtol=0)

    def test_int8_quantizes_experts_and_keeps_the_router_float(self) -> None:
        """quantization="int8": the stacked experts int8 with `[experts, out]` scales (every expert's `gate_up_proj`,
        the routed ones' `down_proj`), linear layers Int8Linear (`kv_b_proj` absorbed dequantised), the router
        float; the int8 model is the float one with its weights rounded; saved per expert and loaded back exactly."""
        ids = self.input_ids[:2, :7]
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir, quantization="int8")
        experts = model.model.layers[0].mlp.experts
        self.assertEqual((experts.gate_up_proj.dtype, experts.gate_up_proj_scale.shape), (torch.int8, (10, 32)))
        self.assertEqual((experts.down_proj.dtype, experts.down_proj_scale.shape), (torch.int8, (8, 32)))
        self.assertEqual(model.model.layers[0].mlp.router.classifier.weight.dtype, torch.float32)
        self.assertEqual(type(model.model.layers[0].self_attn[1].kv_b_proj).__name__, "Int8Linear")
        with torch.no_grad():
            logits = model(ids).logits
            dequantized = dequantized_copy(model, LongcatFlashForCausalLM.from_pretrained(self.tmpdir))(ids).logits
        torch.testing.assert_close(logits, dequantized, atol=ATOL, rtol=0)
        with tempfile.TemporaryDirectory() as out:
            model.save_pretrained(out)
            saved = load_file(f"{out}/model.safetensors")
            self.assertEqual(saved["model.layers.0.mlp.experts.9.up_proj.weight"].dtype, torch.int8)
            self.assertEqual(saved["model.layers.0.mlp.experts.7.down_proj.weight_scale"].shape, (32,))
            reloaded = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            torch.testing.assert_close(reloaded(ids).logits, logits, atol=0, rtol=0)
        # compiled decode of these experts is the float model's graph (test_static_generate_compiles_two_graphs_then_none)
        torch.testing.assert_close(
            model.generate(ids, max_new_tokens=3, eos_token_id=None),
            reloaded.generate(ids, max_new_tokens=3, eos_token_id=None),
        )

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        tp = TensorParallel(rank=0, world_size=2, device=torch.device("cpu"), group=None)
        with self.assertRaisesRegex(ValueError, r"LongcatFlashConfig declares no tensor-parallel plan"):
            load_tensor_parallel(self.models["sdpa"], {}, tp)


def dequantized_copy(quantized: nn.Module, model: nn.Module) -> nn.Module:
    """`model` (the float one) with each weight `quantized` holds as int8 replaced by its dequantized value."""
    with torch.no_grad():
        for name, module in quantized.named_modules():
            for attr, value in list(module.named_parameters(recurse=False)):
                if value.dtype != torch.int8:
                    continue
                scale = getattr(module, f"{attr}_scale").float()
                dequantized = value.float() * (scale[..., None] if value.dim() == 3 else scale[:, None])
                setattr(model.get_submodule(name), attr, nn.Parameter(dequantized))
    return model


class LongcatFlashDenseParityTest(PlainParityTests, unittest.TestCase):
    """No identity experts, top-4 of 6 (the dense formulation in decode too), two layers (cache layers 0 to 3), no
    biases, tied head."""

    upstream_class = RandomLongcatFlashForCausalLM
    plain_config = DENSE


class LongcatFlashConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = LongcatFlashConfig(), transformers.LongcatFlashConfig()
        for field in transformers.LongcatFlashConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_hidden_layers, ours.num_local_experts, ours.intermediate_size), (56, 512, 12288))
        self.assertEqual(ours.rope_parameters["rope_theta"], 1e7)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            LongcatFlashConfig(**ZERO_EXPERTS).save_pretrained(out)
            theirs = transformers.LongcatFlashConfig.from_pretrained(out)
        self.assertEqual((theirs.num_layers, theirs.num_hidden_layers, theirs.zero_expert_num), (1, 2, 2))
        self.assertEqual((theirs.moe_topk, theirs.routed_scaling_factor, theirs.v_head_dim), (2, 2.0, 6))
        with tempfile.TemporaryDirectory() as out:
            transformers.LongcatFlashConfig(**DENSE, output_router_logits=True).save_pretrained(out)
            ours = LongcatFlashConfig.from_pretrained(out)
        self.assertEqual((ours.num_layers, ours.num_hidden_layers, ours.n_routed_experts), (2, 4, 6))
        self.assertEqual((ours.output_router_logits, ours.tie_word_embeddings, ours.qk_head_dim), (True, True, 16))
        self.assertEqual(ours.rope_parameters["rope_theta"], 1000.0)

    def test_what_upstream_cannot_run_is_refused_by_name(self) -> None:
        for name, value in (("q_lora_rank", None), ("head_dim", 16), ("qk_head_dim", 24), ("moe_topk", 20)):
            with self.subTest(name), self.assertRaisesRegex(ValueError, rf"^{name}={value!r} is not supported"):
                LongcatFlashConfig(**{**ZERO_EXPERTS, name: value})
        with self.assertRaisesRegex(ValueError, "num_hidden_layers=6 with num_layers=1"):
            LongcatFlashConfig(**ZERO_EXPERTS, num_hidden_layers=6)

    def test_auto_classes_build_longcat_flash(self) -> None:
        config = LongcatFlashConfig(**DENSE, vocab_size=10)
        self.assertIsInstance(AutoModelForCausalLM.from_config(config), LongcatFlashForCausalLM)


if __name__ == "__main__":
    unittest.main()
