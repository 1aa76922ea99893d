"""Rules on model files (models/*/modeling_*.py):

- `attention-signature`: `*Attention` classes defining `forward` take `attention_mask` and `cache_position`; the
  latter may be waived by `# check_masks: no-cache-position: <reason>` in the class.
- `markers`: every `# check_masks:` comment is `no-cache-position: <non-empty reason>`.
- `no-mask-in-models`: model files never build masks (tril/triu, finfo(...).min, masked_fill on a mask, private
  AttentionMaskConverter attributes)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from .common import DEFS, PKG, Loader, Module, Problem, callee_name

DIRECTIVE_RE = re.compile(r"^#\s*check_masks:\s*no-cache-position\s*(?::\s*(?P<reason>.*))?$")
MASK_HINT = f"masks are made only by AttentionMaskConverter in src/{PKG}/modeling_attn_mask_utils.py"


def waived(mod: Module, cls: ast.ClassDef) -> bool:
    """Whether the class carries `# check_masks: no-cache-position: <reason>` with a non-empty reason."""
    matches = (DIRECTIVE_RE.match(mod.comments.get(n, ("", False))[0]) for n in range(cls.lineno, cls.end_lineno + 1))
    return any(m and (m["reason"] or "").strip() for m in matches)


def check_attention(mod: Module) -> Iterator[Problem]:
    """`*Attention.forward` takes attention_mask and cache_position (the latter waivable with a reason)."""
    for cls in (n for n in ast.walk(mod.tree) if isinstance(n, ast.ClassDef) and n.name.endswith("Attention")):
        forward = next((n for n in cls.body if isinstance(n, DEFS[:2]) and n.name == "forward"), None)
        if forward is None:
            continue
        args = forward.args
        params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        for param in ("attention_mask", "cache_position"):
            if param in params or (param == "cache_position" and waived(mod, cls)):
                continue
            hint = f"add a `{param}` parameter"
            if param == "cache_position":
                hint += ", or put `# check_masks: no-cache-position: <reason>` in the class"
            message = f"{cls.name}.forward does not take {param}"
            yield Problem(mod.rel, forward.lineno, "attention-signature", message, hint=hint)


def check_directives(mod: Module) -> Iterator[Problem]:
    """Every `# check_masks:` comment is a no-cache-position waiver with a reason."""
    for line, (text, _) in sorted(mod.comments.items()):
        match = DIRECTIVE_RE.match(text)
        if re.match(r"^#\s*check_masks:", text) and not (match and (match["reason"] or "").strip()):
            hint = "write `# check_masks: no-cache-position: <one-line reason>`"
            yield Problem(mod.rel, line, "markers", "malformed check_masks marker (a reason is required)", hint=hint)


def mentions_mask(exprs: list[ast.AST]) -> bool:
    names = (callee_name(n) or "" for e in exprs for n in ast.walk(e))
    return any("mask" in name.lower() for name in names)


def mask_builds(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, what) for each mask-building expression."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name, func = callee_name(node.func), node.func
            if name in ("tril", "triu", "tril_", "triu_"):
                yield node.lineno, f"{ast.unparse(func)}(...)"
            elif name in ("masked_fill", "masked_fill_"):
                receiver = func.value if isinstance(func, ast.Attribute) else None
                torch_fn = isinstance(receiver, ast.Name) and receiver.id == "torch"
                exprs = node.args[:2] if torch_fn or receiver is None else [receiver, *node.args[:1]]
                if mentions_mask(exprs):
                    yield node.lineno, f"{ast.unparse(func)}(...) on a mask"
        elif isinstance(node, ast.Attribute) and (finfo_min(node) or private_converter(node)):
            yield node.lineno, ast.unparse(node)


def finfo_min(node: ast.Attribute) -> bool:
    """`torch.finfo(...).min`."""
    return node.attr == "min" and isinstance(node.value, ast.Call) and callee_name(node.value.func) == "finfo"


def private_converter(node: ast.Attribute) -> bool:
    """`AttentionMaskConverter._x` or `self.mask_converter._x`."""
    return node.attr.startswith("_") and callee_name(node.value) in ("AttentionMaskConverter", "mask_converter")


def check_models(root: Path, loader: Loader) -> tuple[list[Problem], int]:
    files = sorted(p for p in (root / "src" / PKG / "models").glob("*/modeling_*.py") if p.parent.name != "auto")
    problems = []
    for mod in filter(None, map(loader.load, files)):
        problems += [*check_attention(mod), *check_directives(mod)]
        for line, what in mask_builds(mod.tree):
            problems.append(Problem(mod.rel, line, "no-mask-in-models", f"builds a mask: {what}", hint=MASK_HINT))
    return problems, len(files)
