"""Repo-wide consistency checks for transformers_static (stdlib only, never imports the library).

Usage:
    python utils/check_masks.py [--root DIR]        check; exit 1 on any problem, 0 with a one-line "ok" otherwise
    python utils/check_masks.py --fix [--root DIR]  rewrite drifted copies from their sources, then check

Rules:
  copies               `# Copied from transformers_static.<module>.<Name>[.<method>] [with A->B, C->D]`, on the line
                       directly above a `class`/`def` (above its decorators), means the definition (from its
                       `class`/`def` line to its end, decorators excluded) equals the source after the renames.
                       Each rename `A->B` also renames `a->b` and `A->B` upper-cased (like upstream `all-casing`);
                       renames apply in order. Leading indentation, trailing whitespace and blank lines are ignored.
                       A line with `# Ignore copy` exempts the statement it starts (trailing comment) or the
                       statement below it (own-line comment), with its body, and the matching source statement
                       (defs/classes matched by name, other statements by aligning their siblings).
                       A nested definition with its own marker is checked against its own source only.
  attention-signature  `*Attention` classes defining `forward` take `attention_mask` and `cache_position`; the
                       latter may be waived by `# check_masks: no-cache-position: <reason>` in the class.
  markers              every `# check_masks:` comment is `no-cache-position: <non-empty reason>`.
  no-mask-in-models    models/*/modeling_*.py never build masks (tril/triu, finfo(...).min, masked_fill on a
                       mask, private AttentionMaskConverter attributes).
  registration, tests  every models/<arch>/ is a key of CONFIG_MAPPING_NAMES and MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
                       and has tests/models/<arch>/test_modeling_<arch>.py defining a class derived (directly or
                       through a class of that file) from CausalLMParityTests, the upstream parity suite.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import re
import sys
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

PKG = "transformers_static"
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
COPY_PREFIX = "# Copied from"
COPY_RE = re.compile(rf"^# Copied from {PKG}\.(?P<target>[A-Za-z_][\w.]*\w)(?:\s+with\s+(?P<renames>.+?))?\s*$")
RENAME_RE = re.compile(r"^(\S+)->(\S+)(?:\s+all-casing)?$")
DIRECTIVE_RE = re.compile(r"^#\s*check_masks:\s*no-cache-position\s*(?::\s*(?P<reason>.*))?$")
IGNORE = "# Ignore copy"
COPY_HINT = "run `make fix-copies` (python utils/check_masks.py --fix) to rewrite it from the source"
MASK_HINT = f"masks are made only by AttentionMaskConverter in src/{PKG}/modeling_attn_mask_utils.py"
MAPPINGS = (
    ("configuration_auto.py", "CONFIG_MAPPING_NAMES"),
    ("modeling_auto.py", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
)
PARITY_BASE = "CausalLMParityTests"


@dataclass(frozen=True, order=True)
class Problem:
    """One finding; sorts by location so the output is deterministic."""

    path: str
    line: int  # 0 when the location is a directory
    rule: str
    message: str
    detail: tuple[str, ...] = ()
    hint: str = ""

    def render(self) -> str:
        loc = f"{self.path}:{self.line}" if self.line else self.path
        out = [f"{loc}: {self.message} (rule: {self.rule})", *(f"    {d}" for d in self.detail)]
        return "\n".join(out + ([f"    hint: {self.hint}"] if self.hint else []))


@dataclass
class Module:
    """A parsed Python file: text lines (1-based via lines[n - 1]), AST and comments by line."""

    rel: str
    text: str
    lines: list[str]
    tree: ast.Module
    comments: dict[int, tuple[str, bool]]  # line -> (comment text, alone on its line)


class Loader:
    """Reads and parses files once; parse failures become problems."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[Path, Module | None] = {}
        self.problems: set[Problem] = set()

    def load(self, path: Path) -> Module | None:
        if path not in self.cache:
            self.cache[path] = self._read(path) if path.is_file() else None
        return self.cache[path]

    def _read(self, path: Path) -> Module | None:
        rel, text = path.relative_to(self.root).as_posix(), path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(text)
        except SyntaxError as err:
            self.problems.add(Problem(rel, err.lineno or 1, "syntax", f"cannot parse: {err.msg}", hint="fix it"))
            return None
        comments = {}
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = (tok.string.rstrip(), not tok.line[: tok.start[1]].strip())
        return Module(rel, text, text.split("\n"), tree, comments)


def start_line(node: ast.AST) -> int:
    """First line of a statement, decorators included."""
    return min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])


def dedent_line(line: str, base: int) -> str:
    """Remove up to `base` columns of leading whitespace and any trailing whitespace."""
    lead = len(line) - len(line.lstrip(" \t"))
    return line[min(lead, base) :].rstrip()


def callee_name(expr: ast.AST) -> str | None:
    """`torch.tril` -> 'tril', `finfo` -> 'finfo'."""
    return expr.attr if isinstance(expr, ast.Attribute) else expr.id if isinstance(expr, ast.Name) else None


def apply_renames(text: str, renames: list[tuple[str, str]]) -> str:
    """Apply `A->B` renames in order, each also lower- and upper-cased (upstream's `all-casing`)."""
    for old, new in renames:
        for a, b in dict.fromkeys([(old, new), (old.lower(), new.lower()), (old.upper(), new.upper())]):
            text = text.replace(a, b)
    return text


# ----------------------------------------------------------------------------------------------- copies


@dataclass
class Site:
    """A `# Copied from` marker and the definition it annotates."""

    mod: Module
    line: int
    target: str
    renames: list[tuple[str, str]]
    node: ast.AST
    name: str


@dataclass
class Side:
    """One side of a comparison: text lines, the compared definition and its statements' parents."""

    lines: list[str]
    root: ast.AST
    parents: dict[ast.AST, tuple[ast.AST, str, int]]


def qualnames(tree: ast.AST, prefix: str = "") -> dict[ast.AST, str]:
    """Dotted names of all class/def nodes."""
    out: dict[ast.AST, str] = {}
    for child in ast.iter_child_nodes(tree):
        name = f"{prefix}{child.name}" if isinstance(child, DEFS) else None
        if name:
            out[child] = name
        out |= qualnames(child, f"{name}." if name else prefix)
    return out


def parse_renames(text: str | None) -> list[tuple[str, str]] | None:
    """`A->B, C->D` -> [(A, B), (C, D)]; None when malformed."""
    pairs = [RENAME_RE.match(part.strip()) for part in text.split(",")] if text else []
    return [(p[1], p[2]) for p in pairs] if all(pairs) else None


def find_sites(mod: Module) -> tuple[list[Site], list[Problem]]:
    """All markers of a module, with problems for malformed or dangling ones."""
    names = qualnames(mod.tree)
    starts = {start_line(n): n for n in names}
    sites, problems = [], []
    for line, (text, alone) in sorted(mod.comments.items()):
        if not text.startswith(COPY_PREFIX):
            continue
        match = COPY_RE.match(text)
        renames = parse_renames(match["renames"]) if match else None
        if renames is None:
            hint = f"write `{COPY_PREFIX} {PKG}.<module>.<Name> [with A->B, C->D]`"
            problems.append(Problem(mod.rel, line, "copies", "malformed copy marker", hint=hint))
        elif not alone or line + 1 not in starts:
            hint = "put the marker on the line directly above the class/def (or its decorators), or remove it"
            message = "copy marker is not followed by a class or def"
            problems.append(Problem(mod.rel, line, "copies", message, hint=hint))
        else:
            node = starts[line + 1]
            sites.append(Site(mod, line, match["target"], renames, node, names[node]))
    return sites, problems


def resolve(root: Path, target: str, loader: Loader) -> tuple[Module, ast.AST] | None:
    """Find `transformers_static.<target>` under src/: the longest module prefix, then nested classes/defs."""
    parts, base = target.split("."), root / "src" / PKG
    for i in range(len(parts) - 1, -1, -1):
        stem = base.joinpath(*parts[:i])
        for candidate in (stem.with_name(stem.name + ".py"), stem / "__init__.py"):
            mod = loader.load(candidate) if i or candidate.name == "__init__.py" else None
            if mod is None:
                continue
            node: ast.AST | None = mod.tree
            for name in parts[i:]:
                node = next((c for c in node.body if isinstance(c, DEFS) and c.name == name), None) if node else None
            return (mod, node) if node is not None else None
    return None


def parent_map(root: ast.AST) -> dict[ast.AST, tuple[ast.AST, str, int]]:
    """Statement -> (parent, field, index) for every statement below `root`."""
    out = {}
    for node in ast.walk(root):
        for field, value in ast.iter_fields(node):
            for i, child in enumerate(value if isinstance(value, list) else []):
                if isinstance(child, (ast.stmt, ast.excepthandler)):
                    out[child] = (node, field, i)
    return out


def stmt_key(lines: list[str], node: ast.AST) -> str:
    return "\n".join(s for s in (line.strip() for line in lines[start_line(node) - 1 : node.end_lineno]) if s)


def counterpart(node: ast.AST, copy: Side, src: Side, rename: Callable[[str], str], memo: dict) -> ast.AST | None:
    """The source statement matching a copy statement: defs/classes by name, others by aligning siblings."""
    if node is copy.root:
        return src.root
    if node in memo:
        return memo[node]
    parent, field, index = copy.parents[node]
    src_siblings = getattr(counterpart(parent, copy, src, rename, memo), field, None)
    memo[node] = None
    if not isinstance(src_siblings, list):
        return None
    if isinstance(node, DEFS):
        same = (s for s in src_siblings if type(s) is type(node) and rename(s.name) == node.name)
        memo[node] = next(same, None)
        return memo[node]
    siblings = getattr(parent, field)
    keys = [stmt_key(src.lines, s) for s in src_siblings], [stmt_key(copy.lines, c) for c in siblings]
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, *keys, autojunk=False).get_opcodes():
        k = i1 + index - j1
        if j1 <= index < j2 and tag in ("equal", "replace") and k < i2 and not isinstance(src_siblings[k], DEFS):
            memo[node] = src_siblings[k]
    return memo[node]


def next_code_line(lines: list[str], line: int) -> int:
    """The first line after `line` that is neither blank nor a comment."""
    line += 1
    while line <= len(lines) and (not lines[line - 1].strip() or lines[line - 1].lstrip().startswith("#")):
        line += 1
    return line


def exempt_block(site: Site, parents: dict, line: int, text: str, alone: bool) -> tuple[int, int, ast.AST] | None:
    """The block a comment exempts: `# Ignore copy` (own line: the next statement; trailing: the statement it
    starts, else the innermost one around it) or a nested `# Copied from` marker (the def right below)."""
    if text.startswith(COPY_PREFIX):
        nested = [n for n in parents if isinstance(n, DEFS) and start_line(n) == line + 1]
        return (line, nested[0].end_lineno, nested[0]) if alone and nested else None
    if IGNORE not in text:
        return None
    anchor = next_code_line(site.mod.lines, line) if alone else line
    starting = [n for n in parents if anchor in (n.lineno, start_line(n))]
    outer = [n for n in starting if parents[n][0] not in starting]
    if not outer and not alone:
        outer = sorted((n for n in parents if n.lineno <= line <= n.end_lineno), key=lambda n: n.end_lineno - n.lineno)
    return (line if alone else start_line(outer[0]), outer[0].end_lineno, outer[0]) if outer else None


def exempt_blocks(site: Site, parents: dict) -> list[tuple[int, int, ast.AST]]:
    """Outermost exempt blocks of a site, as (first line, last line, statement)."""
    found = [
        exempt_block(site, parents, line, text, alone)
        for line, (text, alone) in site.mod.comments.items()
        if site.node.lineno < line <= site.node.end_lineno
    ]
    kept: list[tuple[int, int, ast.AST]] = []
    for block in sorted(filter(None, found), key=lambda b: (b[0], -b[1])):
        if not kept or block[0] > kept[-1][1]:
            kept.append(block)
    return kept


def source_span(lines: list[str], node: ast.AST) -> tuple[int, int]:
    """A source statement's lines, with copy/ignore marker comments directly above it."""
    first = start_line(node)
    while first > 1 and re.match(rf"\s*({IGNORE}|{COPY_PREFIX})", lines[first - 2]):
        first -= 1
    return first, node.end_lineno


def normalise(side: Side, skip: set[int]) -> list[str]:
    """The compared text: dedented, trailing whitespace and blank lines dropped, exempt lines left out."""
    numbers = (n for n in range(side.root.lineno, side.root.end_lineno + 1) if n not in skip)
    return [line for n in numbers if (line := dedent_line(side.lines[n - 1], side.root.col_offset))]


def check_site(root: Path, site: Site, loader: Loader) -> tuple[Problem | None, list[str] | None]:
    """Compare a copy with its source; return a problem and, when fixable, the copy's replacement lines."""
    found = resolve(root, site.target, loader)
    if found is None:
        message, hint = f"stale marker: {PKG}.{site.target} not found", "fix the marker's source or remove it"
        return Problem(site.mod.rel, site.line, "copies", message, hint=hint), None
    src_mod, src_node = found
    copy = Side(site.mod.lines, site.node, parent_map(site.node))
    src = Side(apply_renames(src_mod.text, site.renames).split("\n"), src_node, parent_map(src_node))
    rename, memo, used = (lambda name: apply_renames(name, site.renames)), {}, set()
    pairs = []
    for block in exempt_blocks(site, copy.parents):
        match = counterpart(block[2], copy, src, rename, memo)
        pairs.append((block, None if match in used else match))
        used.add(match)
    skip_copy = {n for (a, b, _), _ in pairs for n in range(a, b + 1)}
    skip_src = {n for _, m in pairs if m is not None for n in range(source_span(src.lines, m)[0], m.end_lineno + 1)}
    expected, actual = normalise(src, skip_src), normalise(copy, skip_copy)
    if expected == actual:
        return None, None
    source = f"{PKG}.{site.target}"
    diff = list(difflib.unified_diff(expected, actual, f"{source} (after renames)", site.mod.rel, lineterm="", n=1))
    diff = diff[:30] + ([f"... ({len(diff) - 30} more diff lines)"] if len(diff) > 30 else [])
    message = f"{site.name} differs from {source}"
    problem = Problem(site.mod.rel, site.node.lineno, "copies", message, tuple(diff), COPY_HINT)
    return problem, rebuild(site, copy, src, pairs, lambda n: counterpart(n, copy, src, rename, memo))


def rebuild(site: Site, copy: Side, src: Side, pairs: list, match: Callable) -> list[str] | None:
    """The renamed source re-indented for the copy, with the copy's exempt blocks spliced in."""
    first, edits = src.root.lineno, []
    for (a, b, node), counter in pairs:
        block = [dedent_line(line, copy.root.col_offset) for line in copy.lines[a - 1 : b]]
        if counter is not None:
            edits.append((source_span(src.lines, counter)[0], counter.end_lineno + 1, block))
            continue
        parent, field, index = copy.parents[node]
        siblings = getattr(parent, field)
        after = [m for m in map(match, siblings[index + 1 :]) if m is not None]
        before = [m for m in map(match, reversed(siblings[:index])) if m is not None]
        if not after and not before:
            return None
        at = source_span(src.lines, after[0])[0] if after else before[0].end_lineno + 1
        edits.append((at, at, block))
    out = [dedent_line(line, src.root.col_offset) for line in src.lines[first - 1 : src.root.end_lineno]]
    for a, b, block in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        out[a - first : b - first] = block
    indent = copy.lines[copy.root.lineno - 1][: copy.root.col_offset]
    return [indent + line if line else "" for line in out]


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "src").rglob("*.py") if "__pycache__" not in p.parts)


def check_copies(root: Path, loader: Loader) -> tuple[list[Problem], int]:
    problems, count = [], 0
    for path in python_files(root):
        mod = loader.load(path)
        sites, found = find_sites(mod) if mod else ([], [])
        problems += found + [p for p in (check_site(root, s, loader)[0] for s in sites) if p]
        count += len(sites)
    return problems, count


def fix_file(root: Path, path: Path) -> list[str]:
    """Rewrite a file's drifted copies, bottom-up so earlier marker lines stay valid; return what was fixed."""
    fixed, limit = [], float("inf")
    while True:
        loader = Loader(root)
        mod = loader.load(path)
        sites = [s for s in (find_sites(mod)[0] if mod else []) if s.line < limit]
        for site in reversed(sites):
            new = check_site(root, site, loader)[1]
            old = mod.lines[site.node.lineno - 1 : site.node.end_lineno]
            if new is not None and new != old:
                mod.lines[site.node.lineno - 1 : site.node.end_lineno] = new
                path.write_text("\n".join(mod.lines), encoding="utf-8")
                fixed.append(f"{mod.rel}:{site.node.lineno}: {site.name} from {PKG}.{site.target}")
                limit = site.line
                break
        else:
            return fixed


def fix_copies(root: Path) -> list[str]:
    """Fix every file, repeating a few times so copies of copies settle."""
    fixed: list[str] = []
    for _ in range(5):
        done = [line for path in python_files(root) for line in fix_file(root, path)]
        fixed += done
        if not done:
            break
    return fixed


# ----------------------------------------------------------------------------------------------- mask contract


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


# ----------------------------------------------------------------------------------------------- registration


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
    for filename, mapping in MAPPINGS:
        rel = f"src/{PKG}/models/auto/{filename}"
        mod = loader.load(root / rel)
        found = mapping_keys(mod, mapping) if mod else None
        if found is None:
            hint = f"define {mapping} = {{...}} in {rel}"
            yield Problem(rel, 1, "registration", f"no dict literal {mapping} found", hint=hint)
            continue
        line, keys = found
        for arch in (a for a in archs if a not in keys):
            hint = f'add a "{arch}" entry to {mapping} in {rel}'
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


# ----------------------------------------------------------------------------------------------- main


def run_checks(root: Path) -> tuple[list[Problem], str]:
    """All problems (sorted, deduplicated) and a summary of what was checked."""
    loader = Loader(root)
    problems, copies = check_copies(root, loader)
    model_problems, models = check_models(root, loader)
    archs = architectures(root) if (root / "src" / PKG / "models").is_dir() else []
    problems += model_problems + list(check_registration(root, loader, archs))
    summary = f"{copies} copies, {models} model files, {len(archs)} architectures"
    return sorted(set(problems) | loader.problems), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check copies, the mask contract and model registration.")
    parser.add_argument("--fix", action="store_true", help="rewrite drifted copies from their sources, then check")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="repository root")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not (root / "src" / PKG).is_dir():
        print(f"check_masks: {root} has no src/{PKG}")
        return 1
    if args.fix:
        for line in fix_copies(root):
            print(f"fixed {line}")
    problems, summary = run_checks(root)
    for problem in problems:
        print(problem.render())
    if problems:
        print(f"check_masks: {len(problems)} problem(s) ({summary})")
        return 1
    print(f"check_masks: ok ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
