"""No import cycles in src/predict: every import (module level and inside functions, which hide a cycle rather than
remove it) is an edge; imports under ``if TYPE_CHECKING:`` never run and are left out. An edge goes to the module an
import names (``from predict.a import b`` to predict.a.b when that is a module, else to predict.a), not to the
packages above it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "predict").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The predict modules `module` imports anywhere in its body (TYPE_CHECKING blocks left out)."""
    found: set[str] = set()

    def target(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if t := target(alias.name):
                    found.add(t)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                if t := target(f"{base}.{alias.name}") if f"{base}.{alias.name}" in known else target(base):
                    found.add(t)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {
        name: _imports(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", known)
        for name, path in mods.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_walker_sees_function_level_imports_and_finds_a_cycle() -> None:
    a = ast.parse("def f():\n    from predict.b import x\n")
    b = ast.parse("from predict import a\nif TYPE_CHECKING:\n    from predict.c import y\n")
    known = {"predict", "predict.a", "predict.b", "predict.c"}
    graph = {"predict.a": _imports(a, "predict.a", False, known), "predict.b": _imports(b, "predict.b", False, known)}
    assert graph == {"predict.a": {"predict.b"}, "predict.b": {"predict.a"}}
    assert cycles(graph) == [["predict.a", "predict.b"]]


def test_src_predict_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "predict.train.labels" in graph and "predict.env.protocol" in graph["predict.train.labels"]
    found = cycles(graph)
    assert not found, "import cycles (modules that import each other, directly or through others): " + "; ".join(
        " <-> ".join(c) for c in found
    )
