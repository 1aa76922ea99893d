import copy
import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.dbrx.configuration_dbrx import DbrxConfig
from transformers_static.models.dbrx.modeling_dbrx import DbrxForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

CLIPPED = dict(
    d_model=32,
    n_heads=4,
    n_layers=3,
    max_seq_len=128,
    attn_config=dict(kv_n_heads=2, clip_qkv=1.5, rope_theta=10000.0),  # the clamp bites on many elements
    ffn_config=dict(
        ffn_hidden_size=24,
        moe_num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
        moe_top_k=2,
        moe_loss_weight=0.05,
        moe_normalize_expert_weights=1.0,
    ),
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
TWO_NORM = dict(
    d_model=32,
    n_heads=4,
    n_layers=2,
    attn_config=dict(kv_n_heads=1, clip_qkv=6.0, rope_theta=500000.0),  # rope_theta here is unused, as upstream
    ffn_config=dict(
        ffn_hidden_size=16,
        moe_num_experts=4,
        moe_top_k=3,  # dense in decode too
        moe_normalize_expert_weights=2.0,  # weights divided by their Euclidean norm
        ffn_act_fn={"name": "gelu"},
    ),
    rope_theta=1000.0,
    initializer_range=0.3,
)


class RandomDbrxForCausalLM(transformers.DbrxForCausalLM):
    """Upstream's model with random LayerNorm weights (upstream initialises them to one, which would not tell
    norm_1 from norm_2)."""

    def __init__(self, config: transformers.DbrxConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.LayerNorm):
                    module.weight.normal_(mean=1.0, std=0.5)


class DbrxParityTest(CausalLMParityTests, unittest.TestCase):
    """Three blocks, top-2 of 8 experts renormalised to sum 1 (p=1), the fused Wqkv clamped to 1.5, two key/value
    heads."""

    upstream_model_class = RandomDbrxForCausalLM
    upstream_config_class = transformers.DbrxConfig
    config_kwargs = CLIPPED

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        """One `[batch * q_len, experts]` per block, the load-balancing loss over the real tokens, and the loss with
        `ffn_config.moe_loss_weight` times it, as upstream."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 3)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)
        lm_only = self.models["sdpa"](self.input_ids, attention_mask=mask_2d, labels=labels).loss
        torch.testing.assert_close(ours.loss - lm_only, 0.05 * ours.aux_loss, atol=1e-6, rtol=0)

    def with_fields(self, attn: dict | None = None, ffn: dict | None = None) -> DbrxForCausalLM:
        """The saved checkpoint loaded with some sub-config fields changed."""
        attn_config = {**CLIPPED["attn_config"], **(attn or {})}
        ffn_config = {**CLIPPED["ffn_config"], **(ffn or {})}
        return DbrxForCausalLM.from_pretrained(self.tmpdir, attn_config=attn_config, ffn_config=ffn_config)

    def test_clip_qkv_bites(self) -> None:
        unclipped = self.with_fields(attn=dict(clip_qkv=None))
        difference = self.logits(unclipped) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_no_clip_equals_upstream_with_a_bound_nothing_reaches(self) -> None:
        """clip_qkv=None clamps nothing (upstream's clamp(None, None) raises instead)."""
        unclipped = self.with_fields(attn=dict(clip_qkv=None))
        config = copy.deepcopy(self.upstream.config)
        config.attn_config.clip_qkv = 1e9
        theirs = RandomDbrxForCausalLM(config).eval()
        theirs.load_state_dict(self.upstream.state_dict())
        torch.testing.assert_close(self.logits(unclipped), self.logits(theirs), atol=ATOL, rtol=0)

    def test_expert_weight_normalisation_matters_and_matches_upstream(self) -> None:
        """None (the top-k softmax weights as they are) and p=3 each change the logits, and equal upstream's."""
        for p in (None, 3.0):
            ours = self.with_fields(ffn=dict(moe_normalize_expert_weights=p))
            difference = self.logits(ours) - self.logits(self.models["sdpa"])
            self.assertGreater(difference.abs().max().item(), 10 * ATOL, p)
            config = copy.deepcopy(self.upstream.config)
            config.ffn_config.moe_normalize_expert_weights = p
            theirs = RandomDbrxForCausalLM(config).eval()
            theirs.load_state_dict(self.upstream.state_dict())
            torch.testing.assert_close(self.logits(ours), self.logits(theirs), atol=ATOL, rtol=0, msg=str(p))

    def test_checkpoint_keeps_upstream_s_fused_expert_matrices(self) -> None:
        """`ffn.experts.mlp.w1` / `v1` / `w2` `[experts * ffn, hidden]` in memory and on disk, both ways."""
        model = self.models["sdpa"]
        names = {name: param.shape for name, param in model.named_parameters() if ".0.ffn." in name}
        self.assertEqual(
            names,
            {
                "transformer.blocks.0.ffn.router.layer.weight": (8, 32),
                "transformer.blocks.0.ffn.experts.mlp.w1": (8 * 24, 32),
                "transformer.blocks.0.ffn.experts.mlp.v1": (8 * 24, 32),
                "transformer.blocks.0.ffn.experts.mlp.w2": (8 * 24, 32),
            },
        )
        with tempfile.TemporaryDirectory() as out:
            model.save_pretrained(out)
            saved = load_file(f"{out}/model.safetensors")
            self.assertEqual(set(saved), set(self.upstream.state_dict()))
            reloaded = transformers.DbrxForCausalLM.from_pretrained(out)
        for name, param in self.upstream.state_dict().items():
            torch.testing.assert_close(reloaded.state_dict()[name], param, atol=0, rtol=0, msg=name)

    def test_router_jitter_only_while_training(self) -> None:
        jittered = self.with_fields(ffn=dict(moe_jitter_eps=0.5))
        torch.testing.assert_close(self.logits(jittered), self.logits(self.models["sdpa"]), atol=ATOL, rtol=0)
        jittered.train()
        torch.manual_seed(0)
        difference = self.logits(jittered) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """The experts' `[experts * ffn, hidden]` matrices fit no split of the plan's styles."""
        with self.assertRaisesRegex(ValueError, "DbrxConfig declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


class DbrxTwoNormParityTest(PlainParityTests, unittest.TestCase):
    """Top-3 of 4 experts (dense in decode too) divided by their 2-norm, GELU experts, one key/value head, a
    rotary base of 1000 (attn_config's rope_theta unused, as upstream), a clamp at 6."""

    upstream_class = RandomDbrxForCausalLM
    plain_config = TWO_NORM


class DbrxConfigTest(unittest.TestCase):
    def assert_fields_equal(self, ours: DbrxConfig, theirs: transformers.DbrxConfig) -> None:
        for field in ("d_model", "n_heads", "n_layers", "max_seq_len", "vocab_size", "resid_pdrop", "emb_pdrop"):
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        for field in ("initializer_range", "output_router_logits", "rope_parameters", "num_key_value_heads"):
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        for field in ("attn_pdrop", "clip_qkv", "kv_n_heads"):
            self.assertEqual(getattr(ours.attn_config, field), getattr(theirs.attn_config, field), field)
        for field in (
            "hidden_size",
            "ffn_act_fn",
            "ffn_hidden_size",
            "moe_num_experts",
            "moe_top_k",
            "moe_jitter_eps",
            "moe_loss_weight",
            "moe_normalize_expert_weights",
        ):
            self.assertEqual(getattr(ours.ffn_config, field), getattr(theirs.ffn_config, field), field)
        for alias in ("hidden_size", "num_attention_heads", "num_hidden_layers", "max_position_embeddings"):
            self.assertEqual(getattr(ours, alias), getattr(theirs, alias), alias)

    def test_defaults_match_upstream(self) -> None:
        self.assert_fields_equal(DbrxConfig(), transformers.DbrxConfig())
        ours = DbrxConfig()
        self.assertEqual((ours.num_local_experts, ours.num_experts_per_tok, ours.router_aux_loss_coef), (4, 1, 0.01))

    def test_hub_config_reads_as_upstream(self) -> None:
        """dbrx-instruct's config.json."""
        hub = dict(
            architectures=["DbrxForCausalLM"],
            model_type="dbrx",
            d_model=6144,
            n_heads=48,
            n_layers=40,
            max_seq_len=32768,
            vocab_size=100352,
            resid_pdrop=0.0,
            emb_pdrop=0.0,
            attn_config=dict(kv_n_heads=8, clip_qkv=8, rope_theta=500000),
            ffn_config=dict(
                ffn_hidden_size=10752, moe_num_experts=16, moe_top_k=4, moe_jitter_eps=0.0, moe_loss_weight=0.05
            ),
            initializer_range=0.02,
            output_router_logits=False,
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
            transformers_version="4.38.0.dev0",
        )
        ours, theirs = DbrxConfig.from_dict(hub), transformers.DbrxConfig.from_dict(hub)
        self.assert_fields_equal(ours, theirs)
        self.assertEqual(
            (ours.num_key_value_heads, ours.dtype, ours.ffn_config.hidden_size), (8, torch.bfloat16, 6144)
        )
        self.assertEqual(ours.rope_parameters["rope_theta"], 10000.0)  # as upstream 5.23 reads it

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            DbrxConfig(**CLIPPED).save_pretrained(out)
            theirs = transformers.DbrxConfig.from_pretrained(out)
        self.assert_fields_equal(DbrxConfig(**CLIPPED), theirs)
        with tempfile.TemporaryDirectory() as out:
            transformers.DbrxConfig(**TWO_NORM).save_pretrained(out)
            ours = DbrxConfig.from_pretrained(out)
            theirs = transformers.DbrxConfig.from_pretrained(out)
        self.assert_fields_equal(ours, theirs)
        self.assertEqual(ours.attn_config.rope_theta, 500000.0)  # kept, as upstream keeps it

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "tie_word_embeddings is not supported for DBRX"):
            DbrxConfig(tie_word_embeddings=True)
        with self.assertRaisesRegex(ValueError, "uniform_expert_assignment=True is not supported"):
            DbrxConfig(ffn_config=dict(uniform_expert_assignment=True))
        DbrxConfig(ffn_config=dict(uniform_expert_assignment=False))
        with self.assertRaisesRegex(ValueError, r"moe_top_k \(5\) must be between 1 and moe_num_experts \(4\)"):
            DbrxConfig(ffn_config=dict(moe_top_k=5))
        with self.assertRaisesRegex(ValueError, r"divisible by attn_config.kv_n_heads \(3\)"):
            DbrxConfig(n_heads=4, d_model=32, attn_config=dict(kv_n_heads=3))
        with self.assertRaisesRegex(ValueError, "clip_qkv must be None or a positive bound"):
            DbrxConfig(attn_config=dict(clip_qkv=0))

    def test_auto_classes(self) -> None:
        model = AutoModelForCausalLM.from_config(DbrxConfig(**TWO_NORM, vocab_size=10))
        self.assertIsInstance(model, DbrxForCausalLM)
