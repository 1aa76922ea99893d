"""The modular rule of utils/check_masks.py (utils/repo_checks/modular.py): a model's differences from its parent,
expanded into the flat modeling file, on the small fake repository of tests/test_check_masks.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .test_check_masks import MODELS, PARITY_TEST, edit, make_repo, run_checker, write

GLM_MODULAR = f"{MODELS}/glm/modular_glm.py"
GLM_MODELING = f"{MODELS}/glm/modeling_glm.py"

MODULAR = '''\
"""Glm: Llama with a gated MLP."""

from torch import nn

from ..llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaModel

GLM_GATE = 2.0


def gate(x):
    return x * GLM_GATE


class GlmMLP(LlamaMLP):
    """Gated."""

    def forward(self, x):
        return self.down_proj(gate(self.up_proj(x)))


class GlmAttention(LlamaAttention):
    extra = nn.Identity

    def extra_method(self):
        return self.extra


class GlmModel(LlamaModel):
    pass
'''


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path)


def add_glm(root: Path, modular: str = MODULAR) -> None:
    write(root, f"{MODELS}/glm/__init__.py", "")
    write(root, GLM_MODULAR, modular)
    write(root, "tests/models/glm/test_modeling_glm.py", PARITY_TEST)
    edit(root, f"{MODELS}/auto/configuration_auto.py", '    "llama"', '    "glm": "GlmConfig",\n    "llama"')
    edit(root, f"{MODELS}/auto/modeling_auto.py", '    "llama"', '    "glm": "GlmForCausalLM",\n    "llama"')


def test_expansion_merges_replaces_and_inserts(repo: Path) -> None:
    add_glm(repo)
    missing = run_checker(repo)
    assert missing.returncode == 1 and f"{GLM_MODELING}: is missing (rule: modular)" in missing.stdout
    fixed = run_checker(repo, "--fix")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert f"fixed {GLM_MODELING} (from modular_glm.py)" in fixed.stdout
    text = (repo / GLM_MODELING).read_text()
    tree = ast.parse(text)
    assert (
        text.startswith("# Generated from modular_glm.py")
        and ast.get_docstring(tree) == "Glm: Llama with a gated MLP."
    )
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    assert list(classes) == ["GlmRMSNorm", "GlmMLP", "GlmAttention", "GlmModel"]  # the parent's order, renamed
    mlp, attention = classes["GlmMLP"], classes["GlmAttention"]
    assert [ast.unparse(b) for b in mlp.bases] == ["nn.Module"]  # the parent's bases, not LlamaMLP
    assert ast.get_docstring(mlp) == "Gated."
    assert [f.name for f in mlp.body if isinstance(f, ast.FunctionDef)] == ["__init__", "forward"]
    assert "gate(self.up_proj(x))" in ast.unparse(mlp) and "self.up_proj = nn.Linear" in ast.unparse(mlp)
    assert [ast.unparse(m).split("(")[0] for m in attention.body][-1] == "def extra_method"
    assert "self.scale = GLM_SCALE" in ast.unparse(attention)  # the parent's text renamed in all casings
    names = [getattr(node, "name", None) for node in tree.body]
    assert names.index("gate") < names.index("GlmMLP")  # a new definition goes before its first user
    assert "llama" not in text.split('"""', 2)[2].lower()  # only the modular file's own docstring names its parent


def test_stale_expansion_is_caught_after_an_edit_of_either_side(repo: Path) -> None:
    add_glm(repo)
    assert run_checker(repo, "--fix").returncode == 0
    edit(repo, GLM_MODELING, "x * GLM_GATE", "x * GLM_GATE * 2")
    result = run_checker(repo)
    assert result.returncode == 1 and "is not the current expansion of modular_glm.py" in result.stdout
    assert run_checker(repo, "--fix").returncode == 0
    edit(
        repo, f"{MODELS}/llama/modeling_llama.py", "eps=1e-6", "eps=1e-5"
    )  # the parent changes: so must the flat file
    assert "is not the current expansion" in run_checker(repo).stdout
    assert run_checker(repo, "--fix").returncode == 0 and "eps=1e-5" in (repo / GLM_MODELING).read_text()


def test_modular_files_the_converter_cannot_expand_are_reported(repo: Path) -> None:
    add_glm(repo, MODULAR.replace('"""Glm: Llama with a gated MLP."""\n', ""))
    assert "cannot expand: has no module docstring" in run_checker(repo).stdout
    two_parents = MODULAR.replace(
        "from ..llama.modeling_llama import",
        "from ..mistral.modeling_mistral import MistralMLP\nfrom ..llama.modeling_llama import",
    )
    write(repo, GLM_MODULAR, two_parents)
    assert "cannot expand: builds on two models (mistral, llama)" in run_checker(repo).stdout


def test_renames_come_from_the_parents_prefix_and_replaced_members_bring_their_comments(repo: Path) -> None:
    """`LlambaMLP(LlamaMLP)` renames Llama->Llamba (the suffix both share, "aMLP", would say Llam->Llamb); a method
    that replaces the parent's keeps its decorator and its own comment, not the parent's."""
    write(repo, f"{MODELS}/llamba/__init__.py", "")
    write(repo, "tests/models/llamba/test_modeling_llamba.py", PARITY_TEST)
    edit(repo, f"{MODELS}/auto/configuration_auto.py", '    "llama"', '    "llamba": "LlambaConfig",\n    "llama"')
    edit(repo, f"{MODELS}/auto/modeling_auto.py", '    "llama"', '    "llamba": "LlambaForCausalLM",\n    "llama"')
    edit(
        repo,
        f"{MODELS}/llama/modeling_llama.py",
        "    def forward(self, x):",
        "    # the parent's note\n    def forward(self, x):",
    )
    write(
        repo,
        f"{MODELS}/llamba/modular_llamba.py",
        '"""Llamba."""\n\nimport torch\n\nfrom ..llama.modeling_llama import LlamaMLP\n\n\n'
        "class LlambaMLP(LlamaMLP):\n    # its own note\n    @torch.no_grad()\n    def forward(self, x):\n"
        "        return self.up_proj(x)  # [batch, q_len, intermediate]\n",
    )
    fixed = run_checker(repo, "--fix")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    text = (repo / f"{MODELS}/llamba/modeling_llamba.py").read_text()
    assert "class LlambaMLP(nn.Module):" in text and "Llamb" + "aa" not in text and "LlambMLP" not in text
    assert "    # its own note\n    @torch.no_grad()\n    def forward(self, x):\n" in text
    assert "return self.up_proj(x)  # [batch, q_len, intermediate]" in text and "the parent's note" not in text
