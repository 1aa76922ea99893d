"""Rule `copies`: a `# Copied from transformers_static.<module>.<Name>[.<method>] [with A->B, C->D]` marker on the line
directly above a `class`/`def` (above its decorators) means the definition (from its `class`/`def` line to its end,
decorators excluded) equals the source after the renames. Each rename `A->B` also renames `a->b` and `A->B`
upper-cased (like upstream `all-casing`); renames apply in order. Leading indentation, trailing whitespace and blank
lines are ignored. A line with `# Ignore copy` exempts the statement it starts (trailing comment) or the statement
below it (own-line comment), with its body, and the matching source statement (defs/classes matched by name, other
statements by aligning their siblings). A nested definition with its own marker is checked against its own source
only. `fix_copies` rewrites drifted copies from their sources."""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .common import DEFS, PKG, Loader, Module, Problem, dedent_line, start_line

COPY_PREFIX = "# Copied from"
COPY_RE = re.compile(rf"^# Copied from {PKG}\.(?P<target>[A-Za-z_][\w.]*\w)(?:\s+with\s+(?P<renames>.+?))?\s*$")
RENAME_RE = re.compile(r"^(\S+)->(\S+)(?:\s+all-casing)?$")
IGNORE = "# Ignore copy"
COPY_HINT = "run `make fix-copies` (python utils/check_masks.py --fix) to rewrite it from the source"


def apply_renames(text: str, renames: list[tuple[str, str]]) -> str:
    """Apply `A->B` renames in order, each also lower- and upper-cased (upstream's `all-casing`)."""
    for old, new in renames:
        for a, b in dict.fromkeys([(old, new), (old.lower(), new.lower()), (old.upper(), new.upper())]):
            text = text.replace(a, b)
    return text


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
