"""int8 weight-only quantization: what it replaces, its accuracy, the saved format, and compiling it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch._dynamo
import transformers
from safetensors import safe_open
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.generation.compilation import compile_forward
from transformers_static.models.gemma2.modeling_gemma2 import Gemma2SoftCappedLMHead
from transformers_static.models.gpt2.modeling_gpt2 import Conv1D
from transformers_static.quantization import Int8Linear, quantize_model, quantize_weight

from .models.causal_lm_tester import count_graphs, perturb

VOCAB = 96
TEXT_FILE = Path(__file__).parent / "fixtures" / "declaration_of_independence.txt"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny tied Llama with a bias-free body and noise on every weight."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = perturb(transformers.LlamaForCausalLM(config), 0.1)
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path)
    return path


def test_quantize_weight_is_symmetric_per_output_channel() -> None:
    torch.manual_seed(0)
    weight = torch.randn(6, 32)
    weight[2] = 0.0
    quantized, scale = quantize_weight(weight, torch.float32)
    assert quantized.dtype == torch.int8 and scale.shape == (6,)
    assert quantized.abs().amax(dim=1).tolist() == [127, 127, 0, 127, 127, 127]  # each row's max reaches 127
    torch.testing.assert_close(scale[[0, 1]], weight[[0, 1]].abs().amax(dim=1) / 127)
    error = (quantized.float() * scale[:, None] - weight).abs()
    assert bool((error <= scale[:, None] / 2 + 1e-7).all())  # rounding to the nearest step


def test_every_linear_and_the_tied_head_become_int8(checkpoint: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(checkpoint, quantization="int8")
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert len(layers) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    assert not [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert isinstance(model.lm_head, Int8Linear) and model.lm_head.weight.dtype == torch.int8
    assert not model.config.tie_word_embeddings  # the head holds its own int8 copy
    assert model.model.embed_tokens.weight.dtype == torch.float32


LAYERS = dict(num_hidden_layers=2, num_attention_heads=4)
GEMMA = dict(hidden_size=32, intermediate_size=64, num_key_value_heads=1, head_dim=8, **LAYERS)
# Every architecture's tiny upstream model (Falcon with its optional biases).
ARCHITECTURES = {
    "axk1": (
        transformers.AXK1ForCausalLM,
        # latent attention (kv_b_proj int8, dequantised where absorbed), a dense layer, then stacked experts
        # quantized per expert and the MoE output norm; the router stays float
        transformers.AXK1Config(
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
            num_key_value_heads=4,
            **LAYERS,
        ),
    ),
    "biogpt": (
        transformers.BioGptForCausalLM,
        transformers.BioGptConfig(hidden_size=32, intermediate_size=64, max_position_embeddings=64, **LAYERS),
    ),
    "bitnet": (
        transformers.BitNetForCausalLM,
        transformers.BitNetConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "bloom": (transformers.BloomForCausalLM, transformers.BloomConfig(hidden_size=32, n_layer=2, n_head=4)),
    "codegen": (
        transformers.CodeGenForCausalLM,
        transformers.CodeGenConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64),
    ),
    "ctrl": (
        transformers.CTRLLMHeadModel,
        transformers.CTRLConfig(n_embd=32, n_layer=2, n_head=4, dff=64, n_positions=64),
    ),
    "cwm": (
        transformers.CwmForCausalLM,
        transformers.CwmConfig(
            hidden_size=32, intermediate_size=64, num_key_value_heads=2, head_dim=8, sliding_window=4, **LAYERS
        ),
    ),
    "diffllama": (
        transformers.DiffLlamaForCausalLM,
        transformers.DiffLlamaConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "deepseek_v2": (
        transformers.DeepseekV2ForCausalLM,
        transformers.DeepseekV2Config(
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=None,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
            **LAYERS,
        ),
    ),
    "deepseek_v3": (
        transformers.DeepseekV3ForCausalLM,
        # latent attention (kv_b_proj int8, dequantised where its weight is absorbed), a dense layer, then stacked
        # experts quantized per expert; the router stays float
        transformers.DeepseekV3Config(
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
            **LAYERS,
        ),
    ),
    "doge": (
        transformers.DogeForCausalLM,
        # keep_window_size left at its default: the keys it keeps can change under int8's rounding (a discontinuity)
        transformers.DogeConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "exaone4": (
        transformers.Exaone4ForCausalLM,
        transformers.Exaone4Config(
            hidden_size=32,
            intermediate_size=64,
            num_key_value_heads=2,
            sliding_window=4,
            sliding_window_pattern=2,
            **LAYERS,
        ),
    ),
    "falcon": (transformers.FalconForCausalLM, transformers.FalconConfig(hidden_size=32, bias=True, **LAYERS)),
    "gemma": (transformers.GemmaForCausalLM, transformers.GemmaConfig(**GEMMA)),
    "gemma2": (
        transformers.Gemma2ForCausalLM,
        transformers.Gemma2Config(final_logit_softcapping=3.0, **GEMMA),
    ),
    "apertus": (
        transformers.ApertusForCausalLM,
        transformers.ApertusConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "arcee": (transformers.ArceeForCausalLM, transformers.ArceeConfig(hidden_size=32, intermediate_size=64, **LAYERS)),
    "glm": (
        transformers.GlmForCausalLM,
        transformers.GlmConfig(hidden_size=32, intermediate_size=64, head_dim=8, **LAYERS),
    ),
    "glm4": (
        transformers.Glm4ForCausalLM,
        transformers.Glm4Config(hidden_size=32, intermediate_size=64, head_dim=8, **LAYERS),
    ),
    "glm4_moe_lite": (
        transformers.Glm4MoeLiteForCausalLM,
        # DeepSeek-V3's latent attention (kv_b_proj int8, dequantised where absorbed), a dense layer, then stacked
        # experts quantized per expert; the router stays float (two groups: with one, int8's rounding flips a
        # near-tied second expert at this seed, 0.14 of the largest logit)
        transformers.Glm4MoeLiteConfig(
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
            num_key_value_heads=4,
            **LAYERS,
        ),
    ),
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "gpt_bigcode": (
        transformers.GPTBigCodeForCausalLM,
        transformers.GPTBigCodeConfig(n_embd=32, n_layer=2, n_head=4, n_positions=64),
    ),
    "gpt_neo": (
        transformers.GPTNeoForCausalLM,
        transformers.GPTNeoConfig(
            hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=4
        ),
    ),
    "gpt_neox": (
        transformers.GPTNeoXForCausalLM,
        transformers.GPTNeoXConfig(hidden_size=32, intermediate_size=64, **LAYERS),
    ),
    "gpt_neox_japanese": (
        transformers.GPTNeoXJapaneseForCausalLM,
        transformers.GPTNeoXJapaneseConfig(hidden_size=32, intermediate_multiple_size=2, rotary_pct=0.5, **LAYERS),
    ),
    "gptj": (transformers.GPTJForCausalLM, transformers.GPTJConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4)),
    "helium": (
        transformers.HeliumForCausalLM,
        transformers.HeliumConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, head_dim=8, **LAYERS),
    ),
    "hrm_text": (
        transformers.HrmTextForCausalLM,
        transformers.HrmTextConfig(hidden_size=32, intermediate_size=64, head_dim=8, H_cycles=2, L_cycles=1, **LAYERS),
    ),
    "internlm3": (
        transformers.LlamaForCausalLM,
        transformers.InternLM3Config(
            hidden_size=32,
            intermediate_size=64,
            num_key_value_heads=2,
            head_dim=16,
            qkv_bias=True,
            bias=True,
            **LAYERS,
        ),
    ),
    "iquestcoder": (
        transformers.LlamaForCausalLM,
        transformers.IQuestCoderConfig(
            hidden_size=32, intermediate_size=64, num_key_value_heads=2, head_dim=8, **LAYERS
        ),
    ),
    "jais2": (
        transformers.Jais2ForCausalLM,
        transformers.Jais2Config(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig(hidden_size=32, intermediate_size=64, **LAYERS)),
    "ministral": (
        transformers.MinistralForCausalLM,
        transformers.MinistralConfig(
            hidden_size=32, intermediate_size=64, num_key_value_heads=2, head_dim=8, sliding_window=4, **LAYERS
        ),
    ),
    "ministral3": (
        transformers.Ministral3ForCausalLM,
        transformers.Ministral3Config(
            hidden_size=32, intermediate_size=64, num_key_value_heads=2, head_dim=8, **LAYERS
        ),
    ),
    "mistral": (
        transformers.MistralForCausalLM,
        transformers.MistralConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "modernbert-decoder": (
        transformers.ModernBertDecoderForCausalLM,
        transformers.ModernBertDecoderConfig(
            hidden_size=32, intermediate_size=64, local_attention=8, cls_token_id=1, sep_token_id=1, **LAYERS
        ),
    ),
    "mpt": (
        transformers.MptForCausalLM,
        transformers.MptConfig(d_model=32, n_layers=2, n_heads=4, attn_config={"clip_qkv": 4.0}),
    ),
    "nanochat": (
        transformers.NanoChatForCausalLM,
        transformers.NanoChatConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "nemotron": (
        transformers.NemotronForCausalLM,
        transformers.NemotronConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "opt": (transformers.OPTForCausalLM, transformers.OPTConfig(hidden_size=32, ffn_dim=64, **LAYERS)),
    "persimmon": (
        transformers.PersimmonForCausalLM,
        transformers.PersimmonConfig(hidden_size=32, intermediate_size=64, **LAYERS),
    ),
    "phi": (transformers.PhiForCausalLM, transformers.PhiConfig(hidden_size=32, intermediate_size=64, **LAYERS)),
    "phi3": (transformers.Phi3ForCausalLM, transformers.Phi3Config(hidden_size=32, intermediate_size=64, **LAYERS)),
    "qwen2": (
        transformers.Qwen2ForCausalLM,
        transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "qwen3": (
        transformers.Qwen3ForCausalLM,
        transformers.Qwen3Config(hidden_size=32, intermediate_size=64, num_key_value_heads=2, head_dim=8, **LAYERS),
    ),
    "gemma3_text": (transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(sliding_window=4, **GEMMA)),
    "gemma3n_text": (
        transformers.Gemma3nForCausalLM,
        transformers.Gemma3nTextConfig(
            sliding_window=4,
            num_kv_shared_layers=0,
            altup_num_inputs=2,
            laurel_rank=4,
            hidden_size_per_layer_input=4,
            vocab_size_per_layer_input=VOCAB,
            activation_sparsity_pattern=[0.9, 0.0],
            **GEMMA,
        ),
    ),
    "gemma4_unified_text": (
        transformers.Gemma4UnifiedForCausalLM,
        transformers.Gemma4UnifiedTextConfig(
            hidden_size=32,
            intermediate_size=64,
            num_key_value_heads=2,
            head_dim=8,
            global_head_dim=16,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=4,
            **LAYERS,
        ),
    ),
    "smollm3": (
        transformers.SmolLM3ForCausalLM,
        transformers.SmolLM3Config(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "stablelm": (
        transformers.StableLmForCausalLM,
        transformers.StableLmConfig(
            hidden_size=32, intermediate_size=64, num_key_value_heads=2, qk_layernorm=True, use_qkv_bias=True, **LAYERS
        ),
    ),
    "starcoder2": (
        transformers.Starcoder2ForCausalLM,
        transformers.Starcoder2Config(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "xglm": (
        transformers.XGLMForCausalLM,
        transformers.XGLMConfig(d_model=32, ffn_dim=64, num_layers=2, attention_heads=4, max_position_embeddings=64),
    ),
    "olmo": (
        transformers.OlmoForCausalLM,
        transformers.OlmoConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, clip_qkv=1.0, **LAYERS),
    ),
    "olmo2": (
        transformers.Olmo2ForCausalLM,
        transformers.Olmo2Config(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **LAYERS),
    ),
    "olmo3": (
        transformers.Olmo3ForCausalLM,
        transformers.Olmo3Config(
            hidden_size=32, intermediate_size=64, num_key_value_heads=2, sliding_window=4, **LAYERS
        ),
    ),
    "seed_oss": (
        transformers.SeedOssForCausalLM,
        transformers.SeedOssConfig(
            hidden_size=32, intermediate_size=64, num_key_value_heads=2, head_dim=16, attention_out_bias=True, **LAYERS
        ),
    ),
    "hunyuan_v1_dense": (
        transformers.HunYuanDenseV1ForCausalLM,
        transformers.HunYuanDenseV1Config(
            hidden_size=32, intermediate_size=64, num_key_value_heads=2, head_dim=8, **LAYERS
        ),
    ),
    "granite": (
        transformers.GraniteForCausalLM,
        transformers.GraniteConfig(hidden_size=32, intermediate_size=64, logits_scaling=4.0, **LAYERS),
    ),
    "granite_swa": (
        transformers.GraniteSWAForCausalLM,
        transformers.GraniteSWAConfig(
            hidden_size=32, intermediate_size=64, num_key_value_heads=2, sliding_window=4, logits_scaling=4.0, **LAYERS
        ),
    ),
    "hyperclovax": (
        transformers.HyperCLOVAXForCausalLM,
        transformers.HyperCLOVAXConfig(hidden_size=32, intermediate_size=64, logits_scaling=0.5, **LAYERS),
    ),
    "cohere": (
        transformers.CohereForCausalLM,
        transformers.CohereConfig(
            hidden_size=32, intermediate_size=64, num_key_value_heads=2, use_qk_norm=True, logit_scale=0.5, **LAYERS
        ),
    ),
    "cohere2": (
        transformers.Cohere2ForCausalLM,
        transformers.Cohere2Config(hidden_size=32, intermediate_size=64, sliding_window=4, logit_scale=0.5, **LAYERS),
    ),
    "cohere_compass_text": (
        transformers.CohereCompassForCausalLM,
        transformers.CohereCompassTextConfig(
            hidden_size=32,
            intermediate_size=64,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"sliding_attention": {"rope_theta": 1e4}, "full_attention": None},
            logit_scale=0.5,
            **LAYERS,
        ),
    ),
    "ernie4_5": (
        transformers.Ernie4_5ForCausalLM,
        transformers.Ernie4_5Config(
            hidden_size=32, intermediate_size=64, num_key_value_heads=2, head_dim=8, use_bias=True, **LAYERS
        ),
    ),
    "minicpm3": (
        transformers.MiniCPM3ForCausalLM,
        # latent attention (kv_b_proj int8, dequantised where its weight is absorbed) and MiniCPM's three scalings
        transformers.MiniCPM3Config(
            hidden_size=32,
            intermediate_size=64,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
            scale_emb=2.0,
            dim_model_base=16,
            num_key_value_heads=4,
            **LAYERS,
        ),
    ),
    "youtu": (
        transformers.YoutuForCausalLM,
        # latent attention (kv_b_proj int8, dequantised where its weight is absorbed), interleaved rope, dense MLPs
        transformers.YoutuConfig(
            hidden_size=32,
            intermediate_size=64,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
            num_key_value_heads=4,
            **LAYERS,
        ),
    ),
    "vaultgemma": (
        transformers.VaultGemmaForCausalLM,
        transformers.VaultGemmaConfig(final_logit_softcapping=3.0, sliding_window=4, **GEMMA),
    ),
}
# Layers that stay in the model dtype on purpose (quantization/__init__.py): Gemma2's soft-capped head.
KEPT_FLOAT = {"gemma2": {"lm_head"}}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def architecture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(architecture, its tiny checkpoint with noise on every weight)."""
    torch.manual_seed(0)
    model_class, config = ARCHITECTURES[request.param]
    config = copy.deepcopy(config)  # the table's config stays as written (saving sets its dtype; int4 reuses it)
    config.vocab_size = VOCAB
    config.bos_token_id = config.eos_token_id = config.pad_token_id = 1
    path = tmp_path_factory.mktemp(request.param)
    perturb(model_class(config), 0.1).save_pretrained(path)
    return request.param, path


def test_every_projection_of_every_architecture_becomes_int8(
    architecture: tuple[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Attention, MLP and head layers of every type (nn.Linear, FalconLinear, GPT-2's Conv1D) become int8; only
    the documented layers stay float, with a warning naming them. Logits stay close to the float model's."""
    name, path = architecture
    fp = AutoModelForCausalLM.from_pretrained(path)
    int8 = AutoModelForCausalLM.from_pretrained(path, quantization="int8")
    projections = {n for n, m in fp.named_modules() if isinstance(m, (nn.Linear, Conv1D))}
    assert len(projections) >= 4 * 2 + 1  # attention in, attention out, MLP in, MLP out per layer, and the head
    kept = KEPT_FLOAT.get(name, set())
    assert {n for n, m in int8.named_modules() if isinstance(m, Int8Linear)} == projections - kept
    assert {n for n, m in int8.named_modules() if isinstance(m, (nn.Linear, Conv1D))} == kept
    assert ("stay in the model dtype" in caplog.text) == bool(kept)
    if name == "gemma2":
        assert type(int8.lm_head) is Gemma2SoftCappedLMHead and int8.lm_head.weight.dtype == torch.float32
        assert int8.config.tie_word_embeddings and int8.lm_head.weight is int8.model.embed_tokens.weight
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = fp(ids).logits
        assert (int8(ids).logits - logits).abs().max() < 0.05 * logits.abs().max()


def test_every_architecture_round_trips_exactly(architecture: tuple[str, Path], tmp_path: Path) -> None:
    """The saved int8 format reloads exactly for every layer type; GPT-2's Conv1D weights are saved `[out, in]`
    like every other int8 weight."""
    name, path = architecture
    model = AutoModelForCausalLM.from_pretrained(path, quantization="int8")
    model.save_pretrained(tmp_path)
    if name == "gpt2":
        with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
            weight = f.get_tensor("transformer.h.0.mlp.c_fc.weight")
        assert weight.dtype == torch.int8 and weight.shape == (4 * 32, 32)  # [out, in]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.state_dict().keys() == model.state_dict().keys()
    for key, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], tensor), key
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_a_linear_layer_of_an_unknown_type_is_refused(checkpoint: Path) -> None:
    """A linear layer with a forward of its own that int8 does not know is refused by name, before any change."""

    class ScaledLinear(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    model.model.layers[1].mlp.up_proj.__class__ = ScaledLinear
    with pytest.raises(ValueError, match=r"\['model.layers.1.mlp.up_proj \(ScaledLinear\)'\]"):
        quantize_model(model)
    assert not [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert not hasattr(model.config, "quantization_config")


def mean_loss(model: nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return float(model(ids, labels=ids).loss)


def test_loss_within_one_percent_of_float(checkpoint: Path) -> None:
    """The quality bound the real model is held to (docs/BENCHMARK.md), on a tiny model: the mean next-token loss
    on 1,024 tokens (the committed text's bytes, folded into the vocabulary) moves by less than 1%."""
    ids = torch.tensor(list(TEXT_FILE.read_bytes()[:1024])) % VOCAB
    fp = AutoModelForCausalLM.from_pretrained(checkpoint)
    int8 = AutoModelForCausalLM.from_pretrained(checkpoint, quantization="int8")
    fp_loss, int8_loss = mean_loss(fp, ids[None]), mean_loss(int8, ids[None])
    assert abs(int8_loss - fp_loss) / fp_loss < 0.01, (fp_loss, int8_loss)
    logits = fp(ids[None, :64]).logits
    assert (int8(ids[None, :64]).logits - logits).abs().max() < 0.05 * logits.abs().max()


def test_save_pretrained_round_trip_is_exact(checkpoint: Path, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(checkpoint, quantization="int8")
    model.save_pretrained(tmp_path)
    marker = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert marker["format"] == "transformers_static" and marker["method"] == "int8" and "quant_method" not in marker
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f.get_tensor("lm_head.weight").dtype == torch.int8
        assert f.get_tensor("model.layers.0.mlp.up_proj.weight_scale").shape == (96,)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.state_dict().keys() == model.state_dict().keys()
    for key, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], tensor), key
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert torch.equal(
        AutoModelForCausalLM.from_pretrained(tmp_path, quantization="int8").lm_head.weight, model.lm_head.weight
    )


def test_upstream_refuses_a_quantized_checkpoint(checkpoint: Path, tmp_path: Path) -> None:
    """Upstream must not load int8 values as float weights: the marker makes it raise."""
    AutoModelForCausalLM.from_pretrained(checkpoint, quantization="int8").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="quant_method"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)


def test_foreign_quantization_config_and_unknown_method_are_refused(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Unknown quantization 'int3'; expected one of \['int8', 'int4'\]"):
        AutoModelForCausalLM.from_pretrained(checkpoint, quantization="int3")
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((checkpoint / name).read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_8bit": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quantized with 'bitsandbytes', which transformers_static cannot load"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_int8_decode_compiles_once(checkpoint: Path) -> None:
    """The user's own compiled forward: two graphs on the first call, none later; tokens equal the eager int8
    model's. And generate's regional compile: one graph, on the first call only."""
    model = AutoModelForCausalLM.from_pretrained(checkpoint, quantization="int8")
    ids = torch.randint(3, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    calls = [
        dict(input_ids=ids, max_new_tokens=6, eos_token_id=None),
        dict(input_ids=ids[:, 3:], max_new_tokens=9, eos_token_id=None),
    ]
    counts, outputs = count_graphs(model, calls, then_no_recompile=True)
    assert counts == [2, 2]
    for call, out in zip(calls, outputs, strict=True):
        assert torch.equal(out, model.generate(**call))
    counter = torch._dynamo.testing.CompileCounter()
    model._compiled_forwards = {"regional": compile_forward(model, "regional", backend=counter)}
    try:
        for call, expected in zip(calls, outputs, strict=True):
            assert torch.equal(model.generate(**call, compile="regional"), expected)
        assert counter.frame_count == 1  # one graph, its layers one shared region
    finally:
        torch._dynamo.reset()
