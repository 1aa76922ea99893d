"""The package's shape: lazy architecture imports, a core that loads weights without generation or the command
line, and no private method silently shadowed by another of a different signature."""

import ast
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import transformers_static
from transformers_static.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES


def imported_after(statement: str) -> set[str]:
    """The transformers_static modules a fresh interpreter has loaded after running `statement`."""
    code = f"{statement}\nimport sys\nprint(' '.join(m for m in sys.modules if m.startswith('transformers_static')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def test_importing_the_package_loads_no_model_file() -> None:
    loaded = imported_after("import transformers_static")
    assert not {m for m in loaded if m.startswith("transformers_static.models.") and ".auto" not in m}


def module_imports(module: str) -> set[str]:
    """The transformers_static modules that `module`'s own source imports (relative imports resolved)."""
    path = Path(importlib.util.find_spec(module).origin)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if _is_module(submodule) else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m.startswith("transformers_static")}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def import_closure(module: str) -> set[str]:
    """Every transformers_static module reachable from `module` through imports written in the sources."""
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(module_imports(current))
    return seen


def test_the_core_that_loads_weights_imports_neither_generation_nor_the_command_line() -> None:
    closure = import_closure("transformers_static.modeling_utils")
    assert "transformers_static.configuration_utils" in closure
    assert not {m for m in closure if m.startswith(("transformers_static.generation", "transformers_static.commands"))}


@pytest.mark.parametrize("name", sorted({*MODEL_MAPPING_NAMES.values(), *MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()}))
def test_architecture_classes_are_public(name: str) -> None:
    assert name in transformers_static.__all__
    assert getattr(transformers_static, name).__name__ == name


def private_method_clashes(cls: type) -> list[str]:
    """Private methods defined by two classes of `cls`'s MRO with different signatures: the one found first
    silently replaces the other for every caller."""
    clashes = []
    seen: dict[str, tuple[type, inspect.Signature]] = {}
    for klass in cls.__mro__:
        for name, attr in vars(klass).items():
            if not name.startswith("_") or name.startswith("__"):
                continue
            func = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            if not inspect.isfunction(func):
                continue
            signature = inspect.signature(func)
            if name in seen and seen[name][1] != signature:
                clashes.append(f"{name}: {seen[name][0].__name__}{seen[name][1]} shadows {klass.__name__}{signature}")
            seen.setdefault(name, (klass, signature))
    return clashes


@pytest.mark.parametrize("name", sorted({*MODEL_MAPPING_NAMES.values(), *MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()}))
def test_no_private_method_shadows_another_of_a_different_signature(name: str) -> None:
    assert private_method_clashes(getattr(transformers_static, name)) == []


def test_the_clash_check_finds_a_clash() -> None:
    class Base:
        def _check(self, position_ids: int) -> None: ...

    class Mixin:
        def _check(self, attention_mask: int, max_new_tokens: int) -> None: ...

    class Model(Mixin, Base): ...

    assert private_method_clashes(Model) == [
        "_check: Mixin(self, attention_mask: int, max_new_tokens: int) -> None shadows Base(self, position_ids: int) -> None"
    ]
