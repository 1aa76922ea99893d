"""What every rule shares: the problem it reports, parsed files, AST helpers."""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

PKG = "transformers_static"
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


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
