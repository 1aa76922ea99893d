"""Modular model files: `models/<arch>/modular_<arch>.py` holds only what a model changes from its parent's files;
its expansions, the flat `modeling_<arch>.py` (and `configuration_<arch>.py`) that readers and the library import,
are generated from the parent's files and must be current.

A modular file imports what it builds on from ONE parent model, `from ..<parent>.modeling_<parent> import ...` and
`from ..<parent>.configuration_<parent> import ...`, and subclasses it: `class GlmAttention(LlamaAttention)`. The
class-name pairs give the renames (`Llama->Glm`, also lower- and upper-cased, as `# Copied from` markers rename),
and the model directories' names rename module names and model types (`llama->seed_oss` for `SeedOss`), all in one
pass, so no rename applies to another's result.
Each parent file it imports from is expanded: its text, renamed, with each of the modular file's definitions in place:
- `class GlmX(LlamaX)` (the parent's class of the same renamed name): the parent's class with the modular class's
  methods and class attributes replacing those of the same name, new ones appended, its docstring if it has one,
  and the parent class's bases in place of `LlamaX`. A method that replaces one of the parent's is written whole:
  the flat class has the parent's bases, so a `super()` in it reaches what the parent's own `super()` reached.
- any other class or function of a name the parent has: replaces it whole; of a new name: inserted before the first
  definition that uses it (else at the end). `del GlmX` at the top level drops the parent's definition.
The modular file's docstring and imports (other than the parent's) head the expansion; imports are then sorted and
the unused ones dropped (ruff), and the result formatted (ruff format, the repository's settings). A class that
subclasses a configuration class goes to the configuration file, everything else to the modeling file.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .common import PKG, Problem

PARENT_RE = re.compile(r"^\.\.(?P<parent>\w+)\.(?P<kind>modeling|configuration)_(?P=parent)$")
COPY_MARKER_RE = re.compile(r"^\s*# Copied from .*\n", re.MULTILINE)
NOQA_RE = re.compile(
    r"\s*# noqa\b.*$", re.MULTILINE
)  # on the modular file's imports: each expansion keeps what it uses


class ModularError(Exception):
    """A modular file the converter cannot expand; the message says what to change."""


def header(modular: str) -> str:
    return (
        f"# Generated from {modular} by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.\n"
    )


@dataclass
class Modular:
    """A parsed modular file: its parent, renames and definitions by target file kind."""

    path: Path
    text: str
    tree: ast.Module
    parent: str = ""
    imported: dict[str, str] = field(default_factory=dict)  # parent name -> kind of the parent file it comes from
    renames: dict[str, str] = field(default_factory=dict)  # every casing: old -> new

    def rename(self, text: str) -> str:
        """`text` with every rename applied in one pass (longest match first)."""
        if not self.renames:
            return text
        pattern = "|".join(re.escape(old) for old in sorted(self.renames, key=len, reverse=True))
        return re.sub(pattern, lambda match: self.renames[match[0]], text)

    def segment(self, node: ast.AST) -> str:
        """`node`'s source lines (decorators included) unindented, with the parent's imported names renamed to their
        counterparts."""
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        lines = self.text.splitlines()[first - 1 : node.end_lineno]
        width = node.col_offset
        text = "\n".join(line[width:] if not line[:width].strip() else line.lstrip() for line in lines)
        return self.rename_names(text)

    def comments_above(self, node: ast.AST) -> str:
        """The comment lines directly above `node` (its decorators), unindented, each ending in a newline."""
        lines = self.text.splitlines()
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
        start = first
        while start > 0 and lines[start - 1].strip().startswith("#"):
            start -= 1
        return "".join(line.strip() + "\n" for line in lines[start:first])

    def rename_names(self, text: str) -> str:
        for name in sorted(self.imported, key=len, reverse=True):
            text = re.sub(rf"\b{name}\b", self.rename(name), text)
        return text


def parse_modular(path: Path) -> Modular:
    """`path` (models/<arch>/modular_<arch>.py) parsed, with its parent and renames."""
    text = path.read_text(encoding="utf-8")
    mod = Modular(path, text, ast.parse(text))
    for node in mod.tree.body:
        match = PARENT_RE.match("." * node.level + (node.module or "")) if isinstance(node, ast.ImportFrom) else None
        if match:
            if mod.parent and mod.parent != match["parent"]:
                raise ModularError(f"builds on two models ({mod.parent}, {match['parent']}): one parent per file")
            mod.parent = match["parent"]
            mod.imported.update({alias.name: match["kind"] for alias in node.names})
    if not mod.parent:
        raise ModularError("imports nothing from a parent model (`from ..<parent>.modeling_<parent> import ...`)")
    if ast.get_docstring(mod.tree) is None:
        raise ModularError("has no module docstring (it becomes the expansions' docstring)")
    ((old, new),) = infer_renames(mod, path.parents[2])
    mod.renames = {old: new, old.lower(): new.lower(), old.upper(): new.upper()}
    arch = path.parent.name  # the directories name modules and model types: llama -> seed_oss, not seedoss
    mod.renames |= {mod.parent: arch, mod.parent.upper(): arch.upper()}
    return mod


def infer_renames(mod: Modular, package: Path) -> list[tuple[str, str]]:
    """The one `Parent->Child` prefix pair of the modular classes and their parent bases: the parent's prefix is its
    `<Prefix>PreTrainedModel` (or `<Prefix>Config`, `<Prefix>Model`) class's, so `MinistralX(MistralX)` is Mistral->Ministral, not
    the common-suffix guess Mi->Mini."""
    prefix = parent_prefix(mod, package)
    pairs = set()
    for node in mod.tree.body:
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id in mod.imported and base.id.startswith(prefix):
                    rest = base.id[len(prefix) :]
                    if node.name.endswith(rest) and len(node.name) > len(rest):
                        pairs.add((prefix, node.name[: len(node.name) - len(rest)]))
    if len(pairs) != 1:
        found = ", ".join(f"{a}->{b}" for a, b in sorted(pairs)) or "none"
        raise ModularError(
            f"its classes must rename the parent's {prefix}* one way (class GlmX({prefix}X)); found: {found}"
        )
    return sorted(pairs)


def parent_prefix(mod: Modular, package: Path) -> str:
    for kind, suffix in (("modeling", "PreTrainedModel"), ("configuration", "Config"), ("modeling", "Model")):
        path = package / "models" / mod.parent / f"{kind}_{mod.parent}.py"
        if path.is_file():
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef) and node.name.endswith(suffix) and node.name != suffix:
                    return node.name[: -len(suffix)]
    raise ModularError(f"finds no {mod.parent} model to build on (its <Prefix>PreTrainedModel, Config or Model)")


def top_level_blocks(text: str, tree: ast.Module) -> list[tuple[ast.stmt, str]]:
    """Each top-level statement with its source, comments above it included."""
    lines = text.splitlines(keepends=True)
    blocks, start = [], 0
    for node in tree.body:
        end = node.end_lineno
        blocks.append((node, "".join(lines[start:end])))
        start = end
    return blocks


def defined_name(node: ast.stmt) -> str | None:
    """The name a top-level class, function or single-name assignment defines."""
    if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
        return node.name
    return member_name(node) if isinstance(node, (ast.Assign, ast.AnnAssign)) else None


def uses(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def target_kind(mod: Modular, node: ast.stmt) -> str:
    """The file a modular definition goes to: configuration for subclasses of a parent configuration class."""
    if isinstance(node, ast.ClassDef):
        for base in node.bases:
            if isinstance(base, ast.Name) and mod.imported.get(base.id) == "configuration":
                return "configuration"
    return "modeling"


def merge_class(mod: Modular, parent: ast.ClassDef, parent_text: str, child: ast.ClassDef) -> str:
    """The parent's class (renamed source `parent_text`) with the modular class's members in place."""
    parent_name = next(b.id for b in child.bases if isinstance(b, ast.Name) and b.id in mod.imported)
    members = {member_name(m): m for m in parent.body if member_name(m)}
    replaced: dict[str, str] = {}
    added: list[str] = []
    for member in child.body:
        name = member_name(member)
        if name is None:
            if is_docstring(member) or isinstance(member, ast.Pass):
                continue
            raise ModularError(f"{child.name}: only methods, class attributes and a docstring can be overridden")
        source = indent(mod.comments_above(member) + mod.segment(member))
        (replaced.__setitem__(name, source) if name in members else added.append(source))
    child_doc = next((m for m in child.body if is_docstring(m)), None)
    bases = [
        *(ast.unparse(b) for b in parent.bases),
        *(
            mod.rename_names(ast.unparse(b))
            for b in child.bases
            if not (isinstance(b, ast.Name) and b.id == parent_name)
        ),
    ]
    body_lines = parent_text.splitlines(keepends=True)
    cursor = member_span(parent.body[0], parent.lineno)[0]
    head = "".join(body_lines[:cursor])
    head = re.sub(r"^class\s+\w+(\(.*?\))?:", f"class {child.name}({', '.join(bases)}):", head, count=1, flags=re.S)
    out = [head]
    if child_doc is not None and not is_docstring(parent.body[0]):
        out.append(indent(mod.segment(child_doc)) + "\n\n")
    for member in parent.body:
        start, end = member_span(member, parent.lineno)
        name = member_name(member)
        gap = body_lines[cursor:start]  # blank lines and comments above the member; a replaced one brings its own
        out.append("".join(line for line in gap if not (name in replaced and line.strip().startswith("#"))))
        cursor = end
        if is_docstring(member) and child_doc is not None:
            out.append(indent(mod.segment(child_doc)) + "\n")
        elif name in replaced:
            out.append(replaced[name] + "\n")
        else:
            out.append("".join(body_lines[start:end]))
    out.extend("\n" + source + "\n" for source in added)
    return "".join(out)


def member_span(member: ast.stmt, class_line: int) -> tuple[int, int]:
    """0-based line range of a class member relative to its class, decorators included."""
    first = min([member.lineno, *(d.lineno for d in getattr(member, "decorator_list", []))])
    return first - class_line, member.end_lineno - class_line + 1


def member_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def indent(text: str) -> str:
    """An unindented member's source at class-body indentation."""
    return "\n".join("    " + line if line.strip() else "" for line in text.splitlines())


def expand(mod: Modular, kind: str, package: Path) -> str:
    """The flat `<kind>_<arch>.py` text for one parent file kind."""
    parent_path = package / "models" / mod.parent / f"{kind}_{mod.parent}.py"
    parent_text = mod.rename(COPY_MARKER_RE.sub("", parent_path.read_text(encoding="utf-8")))
    parent_tree = ast.parse(parent_text)
    blocks = top_level_blocks(parent_text, parent_tree)
    if blocks and is_docstring(blocks[0][0]):
        blocks = blocks[1:]  # the modular file's docstring replaces it
    imports = [text for node, text in blocks if isinstance(node, (ast.Import, ast.ImportFrom))]
    body = [(node, text) for node, text in blocks if not isinstance(node, (ast.Import, ast.ImportFrom))]
    own = [node for node in mod.tree.body if defined_name(node) and target_kind(mod, node) == kind]
    for node in mod.tree.body:
        if isinstance(node, ast.Delete):
            for target in node.targets:
                name = mod.rename_names(ast.unparse(target))
                body = [(n, t) for n, t in body if defined_name(n) != name]
    existing = {defined_name(n) for n, _ in body}
    for node in own:  # first what replaces the parent's definitions, then new ones before their first user
        if defined_name(node) in existing:
            body = place(mod, node, defined_name(node), body)
    for node in own:
        if defined_name(node) not in existing:
            body = place(mod, node, defined_name(node), body)
    own_imports = [
        NOQA_RE.sub("", mod.segment(node)) + "\n"
        for node in mod.tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and not PARENT_RE.match("." * getattr(node, "level", 0) + (getattr(node, "module", None) or ""))
    ]
    docstring = mod.segment(mod.tree.body[0])
    text = header(mod.path.name) + docstring + "\n\n" + "".join(own_imports) + "".join(imports)
    text += "".join("\n" + t.strip("\n") + "\n" for _, t in body)
    return tidy(text, package / "models" / mod.path.parent.name / f"{kind}_{mod.path.parent.name}.py")


def place(mod: Modular, node: ast.stmt, name: str, body: list[tuple[ast.stmt, str]]) -> list[tuple[ast.stmt, str]]:
    """`body` with the modular definition `node` merged, replacing, or inserted."""
    index = next((i for i, (n, _) in enumerate(body) if defined_name(n) == name), None)
    if index is not None:
        parent, parent_text = body[index]
        merges = isinstance(node, ast.ClassDef) and any(
            isinstance(b, ast.Name) and b.id in mod.imported and mod.rename(b.id) == name for b in node.bases
        )
        if merges and isinstance(parent, ast.ClassDef):
            lines = parent_text.splitlines(keepends=True)
            own = "".join(lines[len(lines) - (parent.end_lineno - parent.lineno + 1) :])
            comments = "".join(lines[: len(lines) - len(own.splitlines())])
            text = comments + merge_class(mod, parent, own, node)
        else:
            text = mod.segment(node)
        (merged,) = ast.parse(text).body  # what the flat file defines now, for finding the users of new names
        return [*body[:index], (merged, "\n\n" + text), *body[index + 1 :]]
    users = [i for i, (n, _) in enumerate(body) if uses(n, name)]
    at = users[0] if users else len(body)
    return [*body[:at], (node, "\n\n" + mod.segment(node)), *body[at:]]


def tidy(text: str, path: Path) -> str:
    """Imports sorted, unused ones dropped, formatted: ruff with the repository's settings."""
    for args in (["check", "--fix", "--quiet", "--select", "I,F401", "--exit-zero"], ["format", "--quiet"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(path), "-"],
            input=text,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ModularError(f"ruff {args[0]} failed on the expansion:\n{done.stderr.strip()}")
        text = done.stdout
    return text


def modular_files(root: Path) -> list[Path]:
    return sorted((root / "src" / PKG / "models").glob("*/modular_*.py"))


def expansions(root: Path, path: Path) -> dict[Path, str]:
    """Each file that `path` (a modular file) expands to, with its expected text."""
    mod = parse_modular(path)
    arch = path.parent.name
    if path.name != f"modular_{arch}.py":
        raise ModularError(f"is named for another model: expected modular_{arch}.py")
    kinds = sorted(set(mod.imported.values()))
    package = root / "src" / PKG
    return {path.parent / f"{kind}_{arch}.py": expand(mod, kind, package) for kind in kinds}


def check_modular(root: Path) -> tuple[list[Problem], int]:
    """Problems for modular files that cannot expand and for stale expansions; and how many files were checked."""
    problems, checked = [], 0
    for path in modular_files(root):
        rel = path.relative_to(root).as_posix()
        try:
            expected = expansions(root, path)
        except (ModularError, SyntaxError, OSError) as err:
            problems.append(Problem(rel, 0, "modular", f"cannot expand: {err}"))
            continue
        checked += 1
        for target, text in expected.items():
            current = target.read_text(encoding="utf-8") if target.is_file() else None
            if current != text:
                problems.append(
                    Problem(
                        target.relative_to(root).as_posix(),
                        0,
                        "modular",
                        f"is not the current expansion of {path.name}" if current is not None else "is missing",
                        hint="run `make fix-copies`",
                    )
                )
    return problems, checked


def fix_modular(root: Path) -> list[str]:
    """Rewrite stale expansions, again until none changes (a model's parent may itself be modular); returns what was
    rewritten."""
    fixed: list[str] = []
    for _ in range(len(modular_files(root)) + 1):
        changed = []
        for path in modular_files(root):
            try:
                expected = expansions(root, path)
            except (ModularError, SyntaxError, OSError):
                continue  # reported by check_modular
            for target, text in expected.items():
                if not target.is_file() or target.read_text(encoding="utf-8") != text:
                    target.write_text(text, encoding="utf-8")
                    changed.append(f"{target.relative_to(root).as_posix()} (from {path.name})")
        if not changed:
            break
        fixed += changed
    return list(dict.fromkeys(fixed))
