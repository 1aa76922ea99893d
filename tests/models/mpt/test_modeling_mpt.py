import tempfile
import unittest

import torch
import transformers
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

from transformers_static import AutoConfig, AutoModelForCausalLM, StaticCache
from transformers_static.models.mpt.configuration_mpt import MptConfig
from transformers_static.models.mpt.modeling_mpt import mpt_alibi_slopes

from ..causal_lm_tester import ATOL, CausalLMParityTests, padding_mask, perturb, reference_4d

# Upstream MPT has only its own eager attention (it ignores set_attn_implementation("sdpa")), so the harness's
# reference for our sdpa model is upstream's eager answer: the same computation. Upstream's forward takes no
# position_ids (the harness's are dropped there): its ALiBi bias comes from key slots, relative to the last key.


class MptParityTest(CausalLMParityTests, unittest.TestCase):
    """ALiBi over six heads (not a power of two: MosaicML's interleaved slopes), queries/keys/values clipped, an
    explicit softmax_scale; no biases, LayerNorms without bias, head tied to the embeddings."""

    upstream_model_class = transformers.MptForCausalLM
    upstream_config_class = transformers.MptConfig
    config_kwargs = dict(
        d_model=48,
        n_layers=2,
        n_heads=6,
        max_seq_len=64,
        attn_config=dict(clip_qkv=0.5, softmax_scale=0.4),
        bos_token_id=1,
        eos_token_id=2,
    )


class MptUntiedParityTest(CausalLMParityTests, unittest.TestCase):
    """Four heads (a power of two), the default scale 1 / sqrt(head_dim), no clipping, an untied head."""

    upstream_model_class = transformers.MptForCausalLM
    upstream_config_class = transformers.MptConfig
    config_kwargs = dict(
        d_model=32, n_layers=2, n_heads=4, max_seq_len=64, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2
    )


class MptAlibiTest(unittest.TestCase):
    def test_slopes_match_upstream_bitwise(self) -> None:
        """Any head count, and the bias maximum upstream's function takes (its model always passes 8)."""
        for num_heads in [*range(1, 34), 48, 64]:
            for bias_max in (8, 16, 3):
                theirs = build_mpt_alibi_tensor(num_heads, 2, bias_max)[:, 0, 0]  # [heads]: the bias at distance 1
                ours = mpt_alibi_slopes(num_heads, bias_max)
                torch.testing.assert_close(ours, -theirs, rtol=0, atol=0, msg=f"{num_heads} heads, max {bias_max}")


class MptBeyondUpstreamTest(unittest.TestCase):
    """What upstream's slot-based ALiBi cannot do: keys past max_seq_len (its bias table's length), and a 4D mask
    over a StaticCache with gaps, without position_ids (key positions are then the cache slots)."""

    @classmethod
    def setUpClass(cls) -> None:
        torch.manual_seed(0)
        config = transformers.MptConfig(vocab_size=99, d_model=32, n_layers=2, n_heads=4, max_seq_len=8)
        cls.upstream = perturb(transformers.MptForCausalLM(config), 0.1).eval()
        cls.tmpdir = tempfile.TemporaryDirectory()
        cls.upstream.save_pretrained(cls.tmpdir.name)
        cls.model = AutoModelForCausalLM.from_pretrained(cls.tmpdir.name)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmpdir.cleanup()

    def test_keys_past_max_seq_len(self) -> None:
        """ALiBi extrapolates: 12 keys with max_seq_len 8 (upstream's bias table is too short: it raises). The
        answer is upstream's with a bias table long enough."""
        ids = torch.randint(0, 99, (2, 12))
        with self.assertRaises(RuntimeError), torch.no_grad():
            self.upstream(ids)
        long_table = transformers.MptForCausalLM.from_pretrained(self.tmpdir.name, max_seq_len=16).eval()
        with torch.no_grad():
            torch.testing.assert_close(self.model(ids).logits, long_table(ids).logits, atol=ATOL, rtol=0)

    def test_additive_4d_mask_over_a_static_cache_without_position_ids(self) -> None:
        mask_2d = padding_mask([0, 2], 6)
        ids = torch.randint(0, 99, (2, 6))
        with torch.no_grad():
            expected = self.upstream(ids, attention_mask=mask_2d).logits
        cache = StaticCache(self.model.config, 2, 8)
        full = reference_4d(mask_2d, "4d_additive", kv_len=8)  # [2, 1, 6, 8]
        steps = []
        with torch.no_grad():
            for start, end in [(0, 4), (4, 5), (5, 6)]:
                out = self.model(
                    ids[:, start:end],
                    attention_mask=full[:, :, start:end],
                    past_key_values=cache,
                    cache_position=torch.arange(start, end),
                )
                steps.append(out.logits)
        real = mask_2d.bool()
        torch.testing.assert_close(torch.cat(steps, dim=1)[real], expected[real], atol=ATOL, rtol=0)


class MptConfigTest(unittest.TestCase):
    def test_reads_upstream_config_json(self) -> None:
        upstream = transformers.MptConfig(
            vocab_size=99, d_model=32, n_heads=4, n_layers=2, attn_config={"clip_qkv": 6.0, "softmax_scale": 0.3}
        )
        with tempfile.TemporaryDirectory() as out:
            upstream.save_pretrained(out)
            ours = AutoConfig.from_pretrained(out)
            ours.save_pretrained(f"{out}/again")
            again = AutoConfig.from_pretrained(f"{out}/again")
        self.assertIsInstance(ours, MptConfig)
        self.assertEqual((ours.hidden_size, ours.num_attention_heads, ours.num_hidden_layers), (32, 4, 2))
        self.assertEqual((ours.attn_config.clip_qkv, ours.attn_config.softmax_scale), (6.0, 0.3))
        self.assertFalse(ours.use_cache)
        self.assertEqual(again.to_dict(), ours.to_dict())
        self.assertEqual(ours.to_dict()["attn_config"]["alibi_bias_max"], 8)

    def test_refuses_what_upstream_ignores(self) -> None:
        cases = {
            "expansion_ratio=2": dict(expansion_ratio=2),
            "no_bias=False": dict(no_bias=False),
            "logit_scale=0.5": dict(logit_scale=0.5),
            "logit_scale='inv_sqrt_d_model'": dict(logit_scale="inv_sqrt_d_model"),
            "embedding_fraction=0.1": dict(embedding_fraction=0.1),
            "norm_type='rmsnorm'": dict(norm_type="rmsnorm"),
            "attn_config.attn_type='multiquery_attention'": dict(attn_config={"attn_type": "multiquery_attention"}),
            "attn_config.prefix_lm=True": dict(attn_config={"prefix_lm": True}),
            "attn_config.attn_uses_sequence_id=True": dict(attn_config={"attn_uses_sequence_id": True}),
            "attn_config.qk_ln=True": dict(attn_config={"qk_ln": True}),
            "attn_config.alibi=False": dict(attn_config={"alibi": False}),
            "attn_config.alibi_bias_max=16": dict(attn_config={"alibi_bias_max": 16}),
            r"d_model \(30\) must be divisible by n_heads \(4\)": dict(d_model=30),
        }
        for message, kwargs in cases.items():
            with self.assertRaisesRegex(ValueError, message):
                MptConfig(**{"d_model": 32, "n_heads": 4, **kwargs})

    def test_refused_at_model_init_after_a_change(self) -> None:
        config = MptConfig(d_model=32, n_heads=4, n_layers=1, vocab_size=99)
        config.attn_config.qk_ln = True
        with self.assertRaisesRegex(ValueError, "qk_ln"):
            AutoModelForCausalLM.from_config(config)

    def test_fields_upstream_ignores_without_effect_are_kept(self) -> None:
        """learned_pos_emb, init_device, attn_impl, resid_pdrop and emb_pdrop change nothing upstream either: kept
        for round trips, the same weights and logits."""
        torch.manual_seed(0)
        base = dict(vocab_size=99, d_model=32, n_heads=4, n_layers=1)
        plain = AutoModelForCausalLM.from_config(MptConfig(**base)).eval()
        other = MptConfig(
            learned_pos_emb=False,
            init_device="meta",
            resid_pdrop=0.3,
            emb_pdrop=0.3,
            attn_config={"attn_impl": "flash"},
            **base,
        )
        self.assertEqual(other.attn_config.attn_impl, "flash")
        changed = AutoModelForCausalLM.from_config(other).eval()
        changed.load_state_dict(plain.state_dict())
        ids = torch.randint(0, 99, (1, 5))
        with torch.no_grad():
            torch.testing.assert_close(changed(ids).logits, plain(ids).logits, atol=0, rtol=0)
