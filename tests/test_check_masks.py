"""Tests for utils/check_masks.py: run it as a subprocess on a small fake repository (no torch needed)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CHECKER = REPO_ROOT / "utils" / "check_masks.py"
MODELS = "src/transformers_static/models"
LLAMA_PATH = f"{MODELS}/llama/modeling_llama.py"
MISTRAL_PATH = f"{MODELS}/mistral/modeling_mistral.py"
SOURCE = "transformers_static.models.llama.modeling_llama"

LLAMA = '''\
import torch
from torch import nn

from ...modeling_attn_mask_utils import AttentionMaskConverter

LLAMA_SCALE = 1.0


def rotate_half(x):
    """Rotates half the hidden dims."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * hidden_states * torch.rsqrt(variance + self.variance_epsilon)


class LlamaMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(torch.relu(self.up_proj(x)))


class LlamaAttention(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.scale = LLAMA_SCALE
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states, attention_mask=None, cache_position=None):
        # llama attention: the mask is already 4D and additive
        query = self.q_proj(hidden_states) * self.scale
        scores = query @ query.transpose(-1, -2)
        if attention_mask is not None:
            scores = scores + attention_mask
        return self.o_proj(scores.softmax(-1) @ query)


class LlamaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.mask_converter = AttentionMaskConverter(is_causal=True)
        self.layers = nn.ModuleList([LlamaAttention(config, i) for i in range(config.num_hidden_layers)])

    def forward(self, hidden_states, attention_mask=None, cache_position=None):
        mask = self.mask_converter.to_4d(attention_mask, hidden_states.shape[1], dtype=hidden_states.dtype)
        hidden_states = hidden_states.masked_fill(hidden_states.isnan(), 0.0)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=mask, cache_position=cache_position)
        return hidden_states
'''

MISTRAL_ATTENTION = """\
# Copied from transformers_static.models.llama.modeling_llama.LlamaAttention with Llama->Mistral
class MistralAttention(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.scale = MISTRAL_SCALE
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states, attention_mask=None, cache_position=None):
        # mistral attention: the mask is already 4D and additive
        query = self.q_proj(hidden_states) * self.scale
        scores = query @ query.transpose(-1, -2)
        if attention_mask is not None:
            scores = scores + attention_mask
        return self.o_proj(scores.softmax(-1) @ query)
"""

MISTRAL = f'''\
import torch
from torch import nn

from ...modeling_attn_mask_utils import AttentionMaskConverter

MISTRAL_SCALE = 1.0


class MistralRotary:
    # Copied from transformers_static.models.llama.modeling_llama.rotate_half
    @staticmethod
    def rotate_half(x):
        """Rotates half the hidden dims."""
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)


# Copied from transformers_static.models.llama.modeling_llama.LlamaRMSNorm with Llama->Mistral
class MistralRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * hidden_states * torch.rsqrt(variance + self.variance_epsilon)


class MistralMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=True)

    # Copied from transformers_static.models.llama.modeling_llama.LlamaMLP.forward
    def forward(self, x):
        return self.down_proj(torch.relu(self.up_proj(x)))


{MISTRAL_ATTENTION}

class MistralModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.mask_converter = AttentionMaskConverter(is_causal=True, sliding_window=config.sliding_window)
        self.layers = nn.ModuleList([MistralAttention(config, i) for i in range(config.num_hidden_layers)])

    def forward(self, hidden_states, attention_mask=None, cache_position=None):
        mask = self.mask_converter.to_4d(attention_mask, hidden_states.shape[1], dtype=hidden_states.dtype)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=mask, cache_position=cache_position)
        return hidden_states
'''

CONFIGURATION_AUTO = """\
CONFIG_MAPPING_NAMES = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
}
"""

MODELING_AUTO = """\
MODEL_FOR_CAUSAL_LM_MAPPING_NAMES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
}
"""


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


PARITY_TEST = """\
import unittest

from ..causal_lm_tester import CausalLMParityTests


class ParityTest(CausalLMParityTests, unittest.TestCase):
    pass
"""


def add_arch(root: Path, arch: str, modeling: str, tests: bool = True) -> None:
    write(root, f"{MODELS}/{arch}/__init__.py", "")
    write(root, f"{MODELS}/{arch}/modeling_{arch}.py", modeling)
    if tests:
        write(root, f"tests/models/{arch}/test_modeling_{arch}.py", PARITY_TEST)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path)


def make_repo(tmp_path: Path) -> Path:
    """A minimal clean repository: llama, mistral (copying from llama) and the auto mappings."""
    write(tmp_path, "src/transformers_static/__init__.py", "")
    write(tmp_path, "src/transformers_static/modeling_attn_mask_utils.py", "class AttentionMaskConverter:\n    pass\n")
    write(tmp_path, f"{MODELS}/__init__.py", "")
    write(tmp_path, f"{MODELS}/auto/__init__.py", "")
    write(tmp_path, f"{MODELS}/auto/configuration_auto.py", CONFIGURATION_AUTO)
    write(tmp_path, f"{MODELS}/auto/modeling_auto.py", MODELING_AUTO)
    add_arch(tmp_path, "llama", LLAMA)
    add_arch(tmp_path, "mistral", MISTRAL)
    return tmp_path


def run_checker(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(CHECKER), "--root", str(root), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def edit(root: Path, rel: str, old: str, new: str, count: int = 1) -> None:
    path = root / rel
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == count, f"{old!r} occurs {text.count(old)} times in {rel}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def line_of(root: Path, rel: str, needle: str) -> int:
    lines = (root / rel).read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


def load_checker():
    spec = importlib.util.spec_from_file_location("check_masks", CHECKER)
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_masks"] = module
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------------------- basics


def test_clean_repo_passes(repo: Path) -> None:
    result = run_checker(repo)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.fullmatch(
        r"check_masks: ok \(4 copies, 0 modular files, 2 model files, 2 architectures\)\n", result.stdout
    )


def test_renames_apply_in_order_with_all_casing() -> None:
    checker = load_checker()
    text = "LlamaModel llama LLAMA_SCALE Gemma"
    assert checker.apply_renames(text, [("Llama", "Mistral")]) == "MistralModel mistral MISTRAL_SCALE Gemma"
    assert checker.apply_renames(text, [("Llama", "Gemma"), ("Gemma", "Qwen")]) == "QwenModel qwen QWEN_SCALE Qwen"
    assert checker.parse_renames("Llama->Mistral, llama->mistral all-casing") == [
        ("Llama", "Mistral"),
        ("llama", "mistral"),
    ]
    assert checker.parse_renames("Llama=>Mistral") is None


# ----------------------------------------------------------------------------------------------- copies


def test_drifted_copy_fails(repo: Path) -> None:
    edit(repo, MISTRAL_PATH, "scores = scores + attention_mask", "scores = scores - attention_mask")
    result = run_checker(repo)
    assert result.returncode == 1
    line = line_of(repo, MISTRAL_PATH, "class MistralAttention")
    header = f"{MISTRAL_PATH}:{line}: MistralAttention differs from {SOURCE}.LlamaAttention (rule: copies)"
    assert header in result.stdout
    assert "-            scores = scores + attention_mask" in result.stdout
    assert "+            scores = scores - attention_mask" in result.stdout
    assert "make fix-copies" in result.stdout
    assert result.stdout.count("differs from") == 1


def test_drifted_signature_is_caught(repo: Path) -> None:
    edit(repo, MISTRAL_PATH, "def __init__(self, config, layer_idx=None):", "def __init__(self, config, layer_idx=0):")
    result = run_checker(repo)
    assert result.returncode == 1
    assert "MistralAttention differs from" in result.stdout


def test_whitespace_only_differences_pass(repo: Path) -> None:
    edit(repo, MISTRAL_PATH, "        query = self.q_proj", "\n        query = self.q_proj")
    edit(repo, MISTRAL_PATH, "scores = query @ query.transpose(-1, -2)", "scores = query @ query.transpose(-1, -2)   ")
    assert run_checker(repo).returncode == 0


def test_fix_mends_drift(repo: Path) -> None:
    clean = (repo / MISTRAL_PATH).read_text(encoding="utf-8")
    edit(repo, MISTRAL_PATH, "scores = scores + attention_mask", "scores = scores - attention_mask")
    edit(repo, MISTRAL_PATH, "self.variance_epsilon = eps", "self.variance_epsilon = eps * 2")
    edit(repo, MISTRAL_PATH, "        return self.down_proj(torch.relu(", "        return self.down_proj(torch.gelu(")
    edit(repo, MISTRAL_PATH, "        x1, x2 = x.chunk(2, dim=-1)", "        x2, x1 = x.chunk(2, dim=-1)")
    result = run_checker(repo, "--fix")
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("fixed ") == 4
    fixed = (repo / MISTRAL_PATH).read_text(encoding="utf-8")
    assert fixed == clean
    llama = (repo / LLAMA_PATH).read_text(encoding="utf-8")
    attention = llama[llama.index("class LlamaAttention") : llama.index("class LlamaModel")].rstrip()
    assert attention.replace("Llama", "Mistral").replace("llama", "mistral").replace("LLAMA", "MISTRAL") in fixed
    assert run_checker(repo).returncode == 0


def test_stale_marker_is_caught(repo: Path) -> None:
    edit(repo, MISTRAL_PATH, "LlamaRMSNorm with", "LlamaNorm with")
    edit(repo, MISTRAL_PATH, "llama.modeling_llama.LlamaMLP.forward", "gemma.modeling_gemma.GemmaMLP.forward")
    for args in ((), ("--fix",)):
        result = run_checker(repo, *args)
        assert result.returncode == 1
        norm_line = line_of(repo, MISTRAL_PATH, "LlamaNorm with")
        mlp_line = line_of(repo, MISTRAL_PATH, "GemmaMLP")
        assert (
            f"{MISTRAL_PATH}:{norm_line}: stale marker: {SOURCE}.LlamaNorm not found (rule: copies)" in result.stdout
        )
        gemma = "transformers_static.models.gemma.modeling_gemma.GemmaMLP.forward"
        assert f"{MISTRAL_PATH}:{mlp_line}: stale marker: {gemma} not found (rule: copies)" in result.stdout


def test_marker_without_definition_is_caught(repo: Path) -> None:
    edit(repo, MISTRAL_PATH, "MISTRAL_SCALE = 1.0\n", f"# Copied from {SOURCE}.LLAMA_SCALE\nMISTRAL_SCALE = 1.0\n")
    edit(repo, MISTRAL_PATH, "LlamaRMSNorm with Llama->Mistral\n", "LlamaRMSNorm with Llama->Mistral\n\n")
    edit(repo, MISTRAL_PATH, "LlamaAttention with Llama->Mistral", "LlamaAttention with Llama=>Mistral")
    result = run_checker(repo)
    assert result.returncode == 1
    scale = line_of(repo, MISTRAL_PATH, "LLAMA_SCALE")
    norm = line_of(repo, MISTRAL_PATH, "LlamaRMSNorm with")
    attention = line_of(repo, MISTRAL_PATH, "Llama=>Mistral")
    assert f"{MISTRAL_PATH}:{scale}: copy marker is not followed by a class or def (rule: copies)" in result.stdout
    assert f"{MISTRAL_PATH}:{norm}: copy marker is not followed by a class or def (rule: copies)" in result.stdout
    assert f"{MISTRAL_PATH}:{attention}: malformed copy marker (rule: copies)" in result.stdout


def test_ignore_copy_exempts_blocks(repo: Path) -> None:
    # a trailing marker on a changed statement, an own-line marker above an extra statement, and a whole method
    edit(
        repo,
        MISTRAL_PATH,
        "        self.scale = MISTRAL_SCALE\n",
        "        self.scale = config.scale  # Ignore copy\n"
        "        # Ignore copy: mistral only\n"
        "        self.sliding_window = config.sliding_window\n",
    )
    edit(
        repo,
        MISTRAL_PATH,
        "    def forward(self, hidden_states, attention_mask=None, cache_position=None):\n        # mistral",
        "    def forward(self, hidden_states, attention_mask=None, cache_position=None, window=None):  # Ignore copy\n"
        "        hidden_states = hidden_states[:, -window:]\n        # mistral",
    )
    result = run_checker(repo)
    assert result.returncode == 0, result.stdout

    # a drift outside the exempt blocks is still caught, and --fix keeps the exempt blocks as they are
    edit(
        repo,
        MISTRAL_PATH,
        "        self.layer_idx = layer_idx\n",
        "        self.layer_idx = layer_idx or 0\n",
        count=1,
    )
    result = run_checker(repo)
    assert result.returncode == 1
    assert "-        self.layer_idx = layer_idx\n" in result.stdout
    before = (repo / MISTRAL_PATH).read_text(encoding="utf-8")
    result = run_checker(repo, "--fix")
    assert result.returncode == 0, result.stdout
    after = (repo / MISTRAL_PATH).read_text(encoding="utf-8")
    assert after == before.replace("layer_idx or 0\n", "layer_idx\n")


def test_ignore_copy_does_not_hide_other_changes(repo: Path) -> None:
    edit(repo, MISTRAL_PATH, "        self.scale = MISTRAL_SCALE\n", "        self.scale = 2.0  # Ignore copy\n")
    edit(repo, MISTRAL_PATH, "        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)\n", "")
    result = run_checker(repo)
    assert result.returncode == 1
    assert "-        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)" in result.stdout
    assert "self.scale" not in result.stdout


def test_nested_marker_is_checked_against_its_own_source(repo: Path) -> None:
    # MistralRMSNorm copies LlamaRMSNorm, except for a forward copied from LlamaMLP.forward
    norm_forward = (
        "    def forward(self, hidden_states):\n"
        "        variance = hidden_states.pow(2).mean(-1, keepdim=True)\n"
        "        return self.weight * hidden_states * torch.rsqrt(variance + self.variance_epsilon)\n"
    )
    mlp_forward = (
        f"    # Copied from {SOURCE}.LlamaMLP.forward\n"
        "    def forward(self, x):\n"
        "        return self.down_proj(torch.relu(self.up_proj(x)))\n"
    )
    edit(repo, MISTRAL_PATH, norm_forward, mlp_forward)
    result = run_checker(repo)
    assert result.returncode == 0, result.stdout

    path = repo / MISTRAL_PATH  # the first of two copies of LlamaMLP.forward is the one in MistralRMSNorm
    path.write_text(path.read_text(encoding="utf-8").replace("torch.relu(", "torch.tanh(", 1), encoding="utf-8")
    edit(repo, MISTRAL_PATH, "self.variance_epsilon = eps", "self.variance_epsilon = 2 * eps")
    result = run_checker(repo)
    assert result.returncode == 1
    line = line_of(repo, MISTRAL_PATH, "torch.tanh") - 1
    assert f"{MISTRAL_PATH}:{line}: MistralRMSNorm.forward differs from {SOURCE}.LlamaMLP.forward" in result.stdout
    assert f"MistralRMSNorm differs from {SOURCE}.LlamaRMSNorm (rule: copies)" in result.stdout
    assert result.stdout.count("differs from") == 2

    result = run_checker(repo, "--fix")
    assert result.returncode == 0, result.stdout
    text = (repo / MISTRAL_PATH).read_text(encoding="utf-8")
    assert text.count(mlp_forward) == 2 and "torch.tanh" not in text and "self.variance_epsilon = eps\n" in text


def test_unparsable_file_is_reported(repo: Path) -> None:
    write(repo, f"{MODELS}/mistral/configuration_mistral.py", "class MistralConfig(:\n")
    result = run_checker(repo)
    assert result.returncode == 1
    assert f"{MODELS}/mistral/configuration_mistral.py:1: cannot parse:" in result.stdout
    assert "(rule: syntax)" in result.stdout


# ----------------------------------------------------------------------------------------------- mask contract


def test_mask_built_in_attention_is_caught(repo: Path) -> None:
    edit(
        repo,
        LLAMA_PATH,
        "        if attention_mask is not None:\n",
        "        causal = torch.tril(torch.ones(4, 4))\n"
        "        scores = scores.masked_fill(causal == 0, torch.finfo(scores.dtype).min)\n"
        "        attention_mask = AttentionMaskConverter._unmask_unattended(attention_mask)\n"
        "        causal_mask = scores.new_ones(4, 4).triu(1)\n"
        "        scores = scores.masked_fill(attention_mask == 0, 0.0)\n"
        "        scores = self.mask_converter._cache\n"
        "        if attention_mask is not None:\n",
    )
    result = run_checker(repo)
    assert result.returncode == 1
    first = line_of(repo, LLAMA_PATH, "torch.tril")
    for offset, what in [
        (0, "torch.tril(...)"),
        (1, "torch.finfo(scores.dtype).min"),
        (2, "AttentionMaskConverter._unmask_unattended"),
        (3, "scores.new_ones(4, 4).triu(...)"),
        (4, "scores.masked_fill(...) on a mask"),
        (5, "self.mask_converter._cache"),
    ]:
        assert f"{LLAMA_PATH}:{first + offset}: builds a mask: {what} (rule: no-mask-in-models)" in result.stdout
    assert "masks are made only by AttentionMaskConverter in src/transformers_static/modeling_attn_mask_utils.py" in (
        result.stdout
    )
    # `causal == 0` names no mask, so the first masked_fill is reported only for its finfo(...).min
    assert result.stdout.count("on a mask") == 1
    # the copy in mistral drifted as well
    assert "MistralAttention differs from" in result.stdout


def test_attention_without_cache_position(repo: Path) -> None:
    extra = textwrap.dedent(
        """

        class MistralSlidingAttention(nn.Module):
            def forward(self, hidden_states, attention_mask=None):
                return hidden_states
        """
    )
    write(repo, MISTRAL_PATH, MISTRAL + extra)
    result = run_checker(repo)
    assert result.returncode == 1
    line = line_of(repo, MISTRAL_PATH, "def forward(self, hidden_states, attention_mask=None):")
    message = f"{MISTRAL_PATH}:{line}: MistralSlidingAttention.forward does not take cache_position"
    assert f"{message} (rule: attention-signature)" in result.stdout
    assert "# check_masks: no-cache-position: <reason>" in result.stdout

    marked = extra.replace("(nn.Module):\n", "(nn.Module):\n    # check_masks: no-cache-position: no KV cache\n")
    write(repo, MISTRAL_PATH, MISTRAL + marked)
    result = run_checker(repo)
    assert result.returncode == 0, result.stdout

    write(repo, MISTRAL_PATH, MISTRAL + marked.replace("no-cache-position: no KV cache", "no-cache-position:"))
    result = run_checker(repo)
    assert result.returncode == 1
    assert "does not take cache_position" in result.stdout
    assert "malformed check_masks marker (a reason is required) (rule: markers)" in result.stdout


def test_attention_without_attention_mask(repo: Path) -> None:
    edit(repo, LLAMA_PATH, "def forward(self, hidden_states, attention_mask=None, cache_position=None):\n        #",
         "def forward(self, hidden_states, cache_position=None):\n        #")  # fmt: skip
    result = run_checker(repo)
    assert result.returncode == 1
    assert "LlamaAttention.forward does not take attention_mask (rule: attention-signature)" in result.stdout


# ----------------------------------------------------------------------------------------------- registration


def register_gpt2(repo: Path) -> None:
    edit(repo, f"{MODELS}/auto/configuration_auto.py", "}", '    "gpt2": "GPT2Config",\n}')
    edit(repo, f"{MODELS}/auto/modeling_auto.py", "}", '    "gpt2": "GPT2LMHeadModel",\n}')


def test_architecture_without_tests_is_caught(repo: Path) -> None:
    add_arch(repo, "gpt2", "class GPT2Model:\n    pass\n", tests=False)
    register_gpt2(repo)
    result = run_checker(repo)
    assert result.returncode == 1
    expected = f"{MODELS}/gpt2: gpt2 has no tests/models/gpt2/test_modeling_gpt2.py (rule: tests)"
    assert expected in result.stdout
    assert "registration" not in result.stdout


def test_test_module_without_a_parity_class_is_caught(repo: Path) -> None:
    add_arch(repo, "gpt2", "class GPT2Model:\n    pass\n")
    register_gpt2(repo)
    test = "tests/models/gpt2/test_modeling_gpt2.py"
    write(
        repo,
        test,
        "import unittest\n\n\nclass GPT2Test(unittest.TestCase):\n    def test_nothing(self):\n        pass\n",
    )
    result = run_checker(repo)
    assert result.returncode == 1
    assert f"{test}:1: {test} defines no test class derived from CausalLMParityTests (rule: tests)" in result.stdout


INDIRECT_PARITY_TEST = """\
import unittest

from .. import causal_lm_tester


class GPT2Mixin(causal_lm_tester.CausalLMParityTests):
    pass


class GPT2Test(GPT2Mixin, unittest.TestCase):
    pass
"""


def test_parity_class_through_a_local_base_is_accepted(repo: Path) -> None:
    add_arch(repo, "gpt2", "class GPT2Model:\n    pass\n")
    register_gpt2(repo)
    write(repo, "tests/models/gpt2/test_modeling_gpt2.py", INDIRECT_PARITY_TEST)
    result = run_checker(repo)
    assert result.returncode == 0, result.stdout


def test_unregistered_architecture_is_caught(repo: Path) -> None:
    add_arch(repo, "gpt2", "class GPT2Model:\n    pass\n")
    result = run_checker(repo)
    assert result.returncode == 1
    config = f"{MODELS}/auto/configuration_auto.py:1: gpt2 is not registered in CONFIG_MAPPING_NAMES"
    modeling = f"{MODELS}/auto/modeling_auto.py:1: gpt2 is not registered in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
    assert f"{config} (rule: registration)" in result.stdout
    assert f"{modeling} (rule: registration)" in result.stdout
    assert f'add a "gpt2" entry to CONFIG_MAPPING_NAMES in {MODELS}/auto/configuration_auto.py' in result.stdout


def test_missing_mapping_is_caught(repo: Path) -> None:
    write(repo, f"{MODELS}/auto/modeling_auto.py", "MODEL_MAPPING_NAMES = {}\n")
    result = run_checker(repo)
    assert result.returncode == 1
    assert "no dict literal MODEL_FOR_CAUSAL_LM_MAPPING_NAMES found (rule: registration)" in result.stdout


def test_output_is_sorted_and_deterministic(repo: Path) -> None:
    add_arch(repo, "gpt2", "class GPT2Attention:\n    def forward(self, x):\n        return x.tril()\n", tests=False)
    edit(repo, MISTRAL_PATH, "scores = scores + attention_mask", "scores = scores * attention_mask")
    first, second = run_checker(repo), run_checker(repo)
    assert first.returncode == 1
    assert first.stdout == second.stdout
    headers = [line for line in first.stdout.splitlines() if " (rule: " in line and not line.startswith(" ")]
    assert len(headers) == 7
    keys = [(h.split(":")[0], int(h.split(":")[1]) if h.split(":")[1].isdigit() else 0) for h in headers]
    assert keys == sorted(keys)


# ----------------------------------------------------------------------------------------------- the real tree


def test_real_repository_passes() -> None:
    result = run_checker(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
