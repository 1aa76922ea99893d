"""The package's layers, read from its sources: no import cycle (module-level and function-level imports alike;
`if TYPE_CHECKING:` blocks excluded), no model package importing another (models/auto excepted), and no module a
reader cannot hold (docs/ARCHITECTURE.md, "Layers", draws what may import what)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import transformers_static

PACKAGE_DIR = Path(transformers_static.__file__).parent
MAX_MODULE_LINES = 700


def module_name(path: Path, package_dir: Path = PACKAGE_DIR) -> str:
    parts = ["transformers_static", *path.relative_to(package_dir).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _import_nodes(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under `node`, at any depth (functions, methods, try blocks), except the body of an
    `if TYPE_CHECKING:` block (its `else:` counts)."""
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append(child)
        elif _is_type_checking(child):
            for statement in child.orelse:
                found.extend([statement] if isinstance(statement, (ast.Import, ast.ImportFrom)) else [])
                found.extend(_import_nodes(statement))
        else:
            found.extend(_import_nodes(child))
    return found


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """{module: the package's modules it imports}: `from .x import y` counts as an import of `x.y` when that is a
    module, else of `x`; a package's implicit parent imports do not count. Modular files (`modular_<arch>.py`) are
    sources that `make fix-copies` expands, never imported: their imports of a parent model are no edges."""
    files = {
        module_name(path, package_dir): path
        for path in package_dir.rglob("*.py")
        if not path.name.startswith("modular_")
    }
    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base)
        graph[module] = {target for target in targets if target in files and target != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def model_package(module: str) -> str | None:
    """`transformers_static.models.<name>.x` -> `<name>`; None outside models/ (and for models/__init__)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "models" else None


def cross_model_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if model_package(module) not in (None, "auto")
        for target in targets
        if model_package(target) not in (None, model_package(module))
    )


def test_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50 and "transformers_static.modeling_utils" in graph
    found = cycles(graph)
    assert found == [], "import cycles:\n" + "\n".join(
        " <-> ".join(c) + "\n  " + "\n  ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in found
    )


def test_no_model_package_imports_another() -> None:
    assert cross_model_imports(import_graph()) == []


def test_no_module_over_700_lines() -> None:
    sizes = {module_name(path): len(path.read_text().splitlines()) for path in PACKAGE_DIR.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_the_checks_find_what_they_forbid(tmp_path: Path) -> None:
    """A function-level cycle, a cycle behind `else` of TYPE_CHECKING, and a model importing another are found;
    a TYPE_CHECKING-only import is not an edge."""
    root = tmp_path / "transformers_static"
    files = {
        "__init__.py": "",
        "a.py": "def f():\n    from .b import g\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import x\nelse:\n    from . import a\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n",
        "models/__init__.py": "",
        "models/auto/__init__.py": "from ..llama import modeling_llama\n",
        "models/llama/__init__.py": "",
        "models/llama/modeling_llama.py": "",
        "models/gemma/__init__.py": "",
        "models/gemma/modeling_gemma.py": "from ..llama.modeling_llama import Llama\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    graph = import_graph(root)
    assert "transformers_static.a" not in graph["transformers_static.c"]
    assert cycles(graph) == [["transformers_static.a", "transformers_static.b"]]
    assert cross_model_imports(graph) == [
        "transformers_static.models.gemma.modeling_gemma -> transformers_static.models.llama.modeling_llama"
    ]


GGML_MODULES = ("ggml", "ggml_config_utils", "ggml_gemma", "ggml_layer_norm", "ggml_metadata", "ggml_tensors")


@pytest.mark.parametrize(
    "module", ["transformers_static.modeling_gguf_pytorch_utils", "transformers_static.integrations.ggml"]
)
def test_the_gguf_reader_imports_nothing_above_it(module: str) -> None:
    """The GGUF reader returns plain data: it imports no config, model or tokenizer module of the library (the rope
    arithmetic, a leaf, checks llama3 rope parameters read from a file)."""
    graph = import_graph()
    closure, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current not in closure:
            closure.add(current)
            todo.extend(graph[current])
    ggml = {f"transformers_static.integrations.{name}" for name in GGML_MODULES}
    assert closure <= {module, "transformers_static.integrations", "transformers_static.modeling_rope_utils", *ggml}
    assert not graph["transformers_static.modeling_rope_utils"]
