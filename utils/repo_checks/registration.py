"""Rules `registration` and `tests`: every models/<arch>/ is a key of CONFIG_MAPPING_NAMES and
MODEL_FOR_CAUSAL_LM_MAPPING_NAMES (under its model_type where MODEL_TYPE_TO_MODULE_NAME names the package
otherwise, e.g. gemma3 -> "gemma3_text") and has tests/models/<arch>/test_modeling_<arch>.py defining a class derived
(directly or through a class of that file) from CausalLMParityTests, the upstream parity suite."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from .common import PKG, Loader, Module, Problem

MAPPINGS = (
    ("configuration_auto.py", "CONFIG_MAPPING_NAMES"),
    ("modeling_auto.py", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
)
PARITY_BASE = "CausalLMParityTests"


def mapping_literal(mod: Module, name: str) -> tuple[int, dict[str, str]] | None:
    """(line, {key: value}) of a module-level `NAME = {...}` dict literal of strings."""
    for node in mod.tree.body:
        named = isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
        if named and isinstance(node.value, ast.Dict):
            pairs = zip(node.value.keys, node.value.values, strict=True)
            return node.lineno, {k.value: v.value for k, v in pairs if isinstance(k, ast.Constant)}
    return None


def mapping_keys(mod: Module, name: str) -> tuple[int, set[str]] | None:
    """(line, keys) of a module-level `NAME = {...}` (or OrderedDict([...])) literal."""
    for node in mod.tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue
        value, keys = node.value, None
        if isinstance(value, ast.Dict):
            keys = value.keys
        elif isinstance(value, ast.Call) and value.args and isinstance(value.args[0], (ast.List, ast.Tuple)):
            keys = [e.elts[0] for e in value.args[0].elts if isinstance(e, ast.Tuple) and e.elts]
        if keys is not None:
            return node.lineno, {k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return None


def architectures(root: Path) -> list[str]:
    models = root / "src" / PKG / "models"
    skip = ("auto", "__pycache__")
    return sorted(p.name for p in models.iterdir() if p.is_dir() and p.name not in skip and not p.name.startswith("."))


def check_registration(root: Path, loader: Loader, archs: list[str]) -> Iterator[Problem]:
    config_auto = loader.load(root / f"src/{PKG}/models/auto/configuration_auto.py")
    packages = mapping_literal(config_auto, "MODEL_TYPE_TO_MODULE_NAME") if config_auto else None
    model_type = {package: model_type for model_type, package in (packages[1] if packages else {}).items()}
    for filename, mapping in MAPPINGS:
        rel = f"src/{PKG}/models/auto/{filename}"
        mod = loader.load(root / rel)
        found = mapping_keys(mod, mapping) if mod else None
        if found is None:
            hint = f"define {mapping} = {{...}} in {rel}"
            yield Problem(rel, 1, "registration", f"no dict literal {mapping} found", hint=hint)
            continue
        line, keys = found
        for arch in (a for a in archs if model_type.get(a, a) not in keys):
            hint = f'add a "{model_type.get(arch, arch)}" entry to {mapping} in {rel}'
            yield Problem(rel, line, "registration", f"{arch} is not registered in {mapping}", hint=hint)
    for arch in archs:
        test = f"tests/models/{arch}/test_modeling_{arch}.py"
        if not (root / test).is_file():
            message, hint = f"{arch} has no {test}", f"add {test} (e.g. starting from tests/models/llama)"
            yield Problem(f"src/{PKG}/models/{arch}", 0, "tests", message, hint=hint)
            continue
        mod = loader.load(root / test)
        if mod is not None and not parity_classes(mod):
            message = f"{test} defines no test class derived from {PARITY_BASE}"
            hint = f"subclass {PARITY_BASE} (tests/models/causal_lm_tester.py) with unittest.TestCase for {arch}"
            yield Problem(test, 1, "tests", message, hint=hint)


def parity_classes(mod: Module) -> list[str]:
    """Module-level classes derived from PARITY_BASE, directly or through classes defined before them."""
    known, found = {PARITY_BASE}, []
    for node in mod.tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", None) for b in node.bases}
        if bases & known:
            known.add(node.name)
            found.append(node.name)
    return found
