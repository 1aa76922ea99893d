import tempfile
import unittest
from unittest import mock

import torch
import torch._dynamo
import transformers
from safetensors.torch import load_file
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

from transformers_static import AutoModelForCausalLM, StaticCache
from transformers_static.integrations.tensor_parallel import TensorParallel, load_tensor_parallel
from transformers_static.models.jetmoe import modeling_jetmoe
from transformers_static.models.jetmoe.configuration_jetmoe import JetMoeConfig
from transformers_static.models.jetmoe.modeling_jetmoe import JetMoeForCausalLM, JetMoeParallelExperts

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

GATHERED = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_key_value_heads=2,
    kv_channels=8,  # kv_heads * kv_channels (16) != hidden_size
    intermediate_size=24,
    num_local_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation, both blocks
    num_experts_per_tok=2,
    rms_norm_eps=0.5,  # the final norm's; the layers' norms keep 1e-6, as upstream's
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
DENSE = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_key_value_heads=1,
    kv_channels=16,
    intermediate_size=16,
    num_local_experts=4,
    num_experts_per_tok=3,  # 3 rows pick 9 >= 4: dense in decode too
    activation_function="gelu",
    tie_word_embeddings=False,
    rope_theta=1000.0,
    initializer_range=0.3,
)


class RandomJetMoeForCausalLM(transformers.JetMoeForCausalLM):
    """Upstream's model with random block biases and RMSNorm weights (upstream initialises them to zero and one,
    which would not tell a missing bias or the two layer norms swapped)."""

    def __init__(self, config: transformers.JetMoeConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith("experts.bias") or name.endswith("mlp.bias"):
                    param.normal_(std=0.5)
                if "layernorm" in name or name == "model.norm.weight":
                    param.normal_(mean=1.0, std=0.5)


class JetMoeParityTest(CausalLMParityTests, unittest.TestCase):
    """Top-2 of 8 attention and MLP experts (gathered in decode, dense in prefill), two shared key/value heads,
    random block biases, a final-norm eps far from the layers' 1e-6."""

    upstream_model_class = RandomJetMoeForCausalLM
    upstream_config_class = transformers.JetMoeConfig
    config_kwargs = GATHERED

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            return model(self.input_ids, attention_mask=mask_2d, **kwargs).logits[mask_2d.bool()]

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        """Three float32 `[batch * q_len, experts]` per layer, in upstream's order (the attention router's twice,
        the MLP router's), the load-balancing loss over the real tokens, and the loss with `aux_loss_coef` times
        it, as upstream."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 6)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            self.assertEqual(mine.dtype, torch.float32)
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        self.assertGreater((ours.router_logits[0] - ours.router_logits[2]).abs().max().item(), 0.1)
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)
        without = self.models["sdpa"](self.input_ids, attention_mask=mask_2d, labels=labels)
        self.assertIsNone(without.router_logits)
        self.assertGreater((ours.loss - without.loss).abs().item(), 0)
        coef = JetMoeForCausalLM.from_pretrained(self.tmpdir, aux_loss_coef=0.5)(self.input_ids, **kwargs)
        torch.testing.assert_close(coef.loss, without.loss + 0.5 * ours.aux_loss, atol=1e-5, rtol=0)

    def test_layer_norms_keep_eps_1e_6_and_the_final_norm_uses_rms_norm_eps(self) -> None:
        """Upstream's layers build their RMSNorms with the default eps: ours with `rms_norm_eps` there would not
        match (0.5 in this config), nor a final norm without it."""
        model = self.models["sdpa"]
        self.assertEqual(model.model.layers[0].input_layernorm.variance_epsilon, 1e-6)
        self.assertEqual(model.model.layers[1].post_attention_layernorm.variance_epsilon, 1e-6)
        self.assertEqual(model.model.norm.variance_epsilon, 0.5)
        baseline = self.logits(model)
        wrong = JetMoeForCausalLM.from_pretrained(self.tmpdir)
        for layer in wrong.model.layers:
            layer.input_layernorm.variance_epsilon = layer.post_attention_layernorm.variance_epsilon = 0.5
        self.assertGreater((self.logits(wrong) - baseline).abs().max().item(), 10 * ATOL)

    def test_cache_holds_the_shared_key_value_heads_only(self) -> None:
        """A static cache of `num_key_value_heads` (2) heads, not the 4 query heads; step decoding through it is
        upstream's full forward."""
        model = self.models["eager"]
        cache = StaticCache(model.config, 3, 16)
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        steps = []
        with torch.no_grad():
            for start, end in [(0, 4), *((t, t + 1) for t in range(4, SEQ_LEN))]:
                steps.append(
                    model(
                        self.input_ids[:, start:end],
                        attention_mask=mask_2d[:, :end],
                        past_key_values=cache,
                        cache_position=torch.arange(start, end),
                    ).logits
                )
        self.assertEqual(tuple(cache.key_cache[0].shape), (3, 2, 16, 8))
        expected = self.upstream_logits(mask_2d, "eager")
        self.assert_close_on_real_tokens(torch.cat(steps, dim=1), expected, mask_2d)

    def test_gathered_and_dense_formulations_agree(self) -> None:
        """The same tokens through either formulation of both blocks (forced by patching the choice) give the
        same outputs: the decode path is the prefill path's routing, not another model."""
        layer = self.models["sdpa"].model.layers[0]
        hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(3))
        results = {}
        for gathered in (True, False):
            with mock.patch.object(modeling_jetmoe, "gathers", return_value=gathered), torch.no_grad():
                queries, logits, routing = layer.self_attention.experts.map(hidden)
                heads = torch.randn(queries.shape, generator=torch.Generator().manual_seed(4))
                reduced = layer.self_attention.experts.reduce(heads, routing)
                mlp, _ = layer.mlp(hidden[None])
            results[gathered] = (queries, reduced, mlp)
        for a, b in zip(results[True], results[False], strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

    def test_checkpoint_keys_are_upstream_s(self) -> None:
        """Saved as upstream saves: `experts.input_linear.weight`, `router.layer.weight`, the blocks' `bias`,
        `kv_proj`; the in-memory names are upstream's too."""
        model = self.models["sdpa"]
        self.assertEqual(model.model.layers[0].self_attention.experts.input_linear.weight.shape, (8, 16, 32))
        with tempfile.TemporaryDirectory() as out:
            model.save_pretrained(out)
            ours = load_file(f"{out}/model.safetensors")
        theirs = load_file(f"{self.tmpdir}/model.safetensors")
        self.assertEqual(sorted(ours), sorted(theirs))
        self.assertEqual(sorted(dict(model.named_parameters())), sorted(dict(self.upstream.named_parameters())))
        for key in ("self_attention.experts.output_linear.weight", "mlp.router.layer.weight", "mlp.bias"):
            torch.testing.assert_close(ours[f"model.layers.1.{key}"], theirs[f"model.layers.1.{key}"], atol=0, rtol=0)

    def test_int8_quantizes_both_blocks_experts_per_output_channel(self) -> None:
        """quantization="int8": attention and MLP experts int8 of their own shape with `[experts, out]` scales,
        `kv_proj` an Int8Linear, the routers and biases float; logits near float's; saved as upstream's stacked
        names plus `weight_scale` and loaded back exactly; compiled generate is two graphs."""
        ids = self.input_ids[:2, :7]
        float_model = self.models["sdpa"]
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir, quantization="int8")
        layer = model.model.layers[0]
        for experts in (layer.self_attention.experts, layer.mlp):
            for name in ("input_linear", "output_linear"):
                stacked = getattr(experts, name)
                self.assertEqual(stacked.weight.dtype, torch.int8)
                self.assertEqual(stacked.weight_scale.shape, (8, stacked.weight.shape[1]))
            self.assertEqual(experts.router.layer.weight.dtype, torch.float32)
            self.assertEqual(experts.bias.dtype, torch.float32)
        self.assertEqual(type(layer.self_attention.kv_proj).__name__, "Int8Linear")
        with torch.no_grad():
            expected, logits = float_model(ids).logits, model(ids).logits
            dequantized = dequantized_copy(model, JetMoeForCausalLM.from_pretrained(self.tmpdir))(ids).logits
        # the int8 model is the float model with its weights rounded (exactly, every router's choice included) ...
        torch.testing.assert_close(logits, dequantized, atol=ATOL, rtol=0)
        # ... and near float's: rounding flips a few near-tied choices of the four routers, so 0.15, not 0.05
        self.assertLess((logits - expected).abs().max(), 0.15 * expected.abs().max())
        with tempfile.TemporaryDirectory() as out:
            model.save_pretrained(out)
            saved = load_file(f"{out}/model.safetensors")
            self.assertEqual(saved["model.layers.0.mlp.input_linear.weight"].dtype, torch.int8)
            self.assertEqual(saved["model.layers.0.self_attention.experts.output_linear.weight_scale"].shape, (8, 32))
            reloaded = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            torch.testing.assert_close(reloaded(ids).logits, logits, atol=0, rtol=0)
        counter = CompileCounterWithBackend("eager")
        torch._dynamo.reset()
        model.forward = torch.compile(model.forward, backend=counter, fullgraph=True, dynamic=False)
        try:
            tokens = model.generate(ids, max_new_tokens=4, eos_token_id=None)
        finally:
            del model.forward
            torch._dynamo.reset()
        self.assertEqual(counter.frame_count, 2)  # prefill and decode
        torch.testing.assert_close(tokens, reloaded.generate(ids, max_new_tokens=4, eos_token_id=None))

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan (a fused key/value projection, heads split inside each attention expert): refused, naming the
        config, before any module changes."""
        model = self.models["sdpa"]
        tp = TensorParallel(rank=0, world_size=2, device=torch.device("cpu"), group=None)
        with self.assertRaisesRegex(ValueError, r"JetMoeConfig declares no tensor-parallel plan"):
            load_tensor_parallel(model, {}, tp)


def dequantized_copy(quantized: nn.Module, model: nn.Module) -> nn.Module:
    """`model` (the float one) with each weight that `quantized` holds as int8 replaced by its dequantized value (a
    tied head untied, as int8 unties it)."""
    with torch.no_grad():
        for name, module in quantized.named_modules():
            weight = getattr(module, "weight", None)
            if weight is None or weight.dtype != torch.int8:
                continue
            scale = module.weight_scale.float()
            dequantized = weight.float() * (scale[..., None] if weight.dim() == 3 else scale[:, None])
            model.get_submodule(name).weight = nn.Parameter(dequantized)
    return model


class JetMoeDenseParityTest(PlainParityTests, unittest.TestCase):
    """Top-3 of 4 experts (the dense formulation in decode too), one key/value head, GELU experts, untied head."""

    upstream_class = RandomJetMoeForCausalLM
    plain_config = DENSE


class JetMoeConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = JetMoeConfig(), transformers.JetMoeConfig()
        for field in transformers.JetMoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_attention_heads, ours.head_dim), (theirs.num_attention_heads, theirs.head_dim))
        self.assertEqual((ours.num_attention_heads, ours.head_dim, ours.router_aux_loss_coef), (32, 128, 0.01))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            JetMoeConfig(**GATHERED, aux_loss_coef=0.25).save_pretrained(out)
            theirs = transformers.JetMoeConfig.from_pretrained(out)
        self.assertEqual((theirs.num_local_experts, theirs.num_experts_per_tok, theirs.kv_channels), (8, 2, 8))
        self.assertEqual((theirs.num_attention_heads, theirs.rms_norm_eps, theirs.aux_loss_coef), (4, 0.5, 0.25))
        with tempfile.TemporaryDirectory() as out:
            transformers.JetMoeConfig(**DENSE, output_router_logits=True).save_pretrained(out)
            ours = JetMoeConfig.from_pretrained(out)
        self.assertEqual((ours.num_local_experts, ours.num_experts_per_tok, ours.tie_word_embeddings), (4, 3, False))
        self.assertEqual((ours.activation_function, ours.output_router_logits, ours.head_dim), ("gelu", True, 16))
        self.assertEqual((ours.rope_parameters["rope_theta"], ours.num_attention_heads), (1000.0, 3))

    def test_num_attention_heads_is_derived_and_bad_configs_are_refused(self) -> None:
        self.assertEqual(
            JetMoeConfig(num_key_value_heads=3, num_experts_per_tok=2, num_attention_heads=7).num_attention_heads, 6
        )
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and"):
            JetMoeConfig(num_local_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, "activation"):
            JetMoeForCausalLM(JetMoeConfig(**{**DENSE, "activation_function": "no_such_act"}, vocab_size=10))

    def test_auto_classes_build_jetmoe(self) -> None:
        config = JetMoeConfig(**DENSE, vocab_size=10)
        self.assertIsInstance(AutoModelForCausalLM.from_config(config), JetMoeForCausalLM)
        self.assertIsInstance(
            AutoModelForCausalLM.from_config(config).model.layers[0].mlp.input_linear, JetMoeParallelExperts
        )


if __name__ == "__main__":
    unittest.main()
