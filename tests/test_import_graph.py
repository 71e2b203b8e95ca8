"""The import graph of kvsim's library packages (``sim``, ``policies``, ``traces``) has no cycle,
and every name imported from a module of the repository exists there.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import`` counts,
at module level or inside a function (a lazy import is still a dependency), except under ``if
TYPE_CHECKING:``. An import of ``a.b.c`` from outside package ``a.b`` also runs the packages'
``__init__`` modules, so it depends on them too (``a`` and ``a.b``, where the importer is not
inside them).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "policies", "traces")


def module_files(root: Path, packages) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file of ``packages`` under ``root``
    (a package is named by its ``__init__.py``)."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) bodies."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            name = (t.id if isinstance(t, ast.Name) else
                    t.attr if isinstance(t, ast.Attribute) else "")
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skip.update(id(n) for n in ast.walk(child))
    return skip


def _targets(importer: str, is_package: bool, node, modules) -> list[str]:
    """The modules of ``modules`` that the import statement ``node`` in module ``importer``
    runs: the module named (or the package, for a name defined in its ``__init__``) and the
    packages above it that ``importer`` is not inside."""
    named = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = importer.split(".") if is_package else importer.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            pkg = ".".join(base + ([node.module] if node.module else []))
        else:
            pkg = node.module
        names = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in modules else pkg for a in node.names]
    for name in names:
        while name and name not in modules:  # (import a.b.c of a name: the module holding it)
            name = name.rpartition(".")[0]
        if not name:
            continue
        parts = name.split(".")
        inside = importer.split(".") if is_package else importer.split(".")[:-1]
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent in modules and parts[:i] != inside[:i]:
                named.append(parent)
        named.append(name)
    return named


def import_graph(root: Path = REPO, packages=PACKAGES) -> dict[str, dict[str, tuple[str, int]]]:
    """``{module: {imported module: (file, line of its first import)}}`` over ``packages``
    (imports of modules outside them are left out; a module's import of itself too)."""
    modules = module_files(root, packages)
    graph: dict[str, dict[str, tuple[str, int]]] = {}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _type_checking_nodes(tree)
        edges: dict[str, tuple[str, int]] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                for t in _targets(mod, path.name == "__init__.py", node, modules):
                    if t != mod:
                        edges.setdefault(t, (str(path.relative_to(root)), node.lineno))
        graph[mod] = edges
    return graph


def cycles(graph) -> list[tuple[str, ...]]:
    """Every elementary cycle of ``graph`` (``{node: iterable of successors}``) once, as its
    nodes in edge order starting from the smallest name (``(a, b)``: a -> b -> a)."""
    found = []
    for start in sorted(graph):
        path, on = [start], {start}
        stack = [iter(sorted(graph[start]))]
        while stack:
            for w in stack[-1]:
                if w == start:
                    found.append(tuple(path))
                elif w > start and w not in on and w in graph:
                    path.append(w)
                    on.add(w)
                    stack.append(iter(sorted(graph[w])))
                    break
            else:
                stack.pop()
                on.discard(path.pop())
    return found


def _describe(cycle, graph) -> str:
    steps = [f"{a} -> {b} ({graph[a][b][0]}:{graph[a][b][1]})"
             for a, b in zip(cycle, cycle[1:] + cycle[:1])]
    return "; ".join(steps)


def test_import_graph_of_the_library_has_no_cycle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(_describe(c, graph) for c in found)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_import_graph_reads_module_function_relative_and_package_imports(tmp_path):
    _write(tmp_path, {
        "p/__init__.py": "from .a import A\n",
        "p/a.py": "import os\nfrom . import b\nA = 1\n",
        "p/b.py": "def f():\n    from .c import g\n    return g\n",
        "p/c.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n"
                   "from q.sub.d import D\ng = 1\n"),
        "q/__init__.py": "",
        "q/sub/__init__.py": "",
        "q/sub/d.py": "from p import A\nD = 1\n",
    })
    graph = import_graph(tmp_path, ("p", "q"))
    assert {m: set(e) for m, e in graph.items()} == {
        "p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.c"},
        "p.c": {"q", "q.sub", "q.sub.d"},  # (TYPE_CHECKING's import of p.a left out)
        "q": set(), "q.sub": set(), "q.sub.d": {"p"},
    }
    assert graph["p.b"]["p.c"] == (str(Path("p/b.py")), 2)
    assert cycles(graph) == [("p", "p.a", "p.b", "p.c", "q.sub.d")]


def test_cycles_lists_each_elementary_cycle_once_from_its_smallest_node():
    graph = {"a": ["b"], "b": ["a", "c"], "c": ["a"], "d": ["a"]}
    assert sorted(cycles(graph)) == [("a", "b"), ("a", "b", "c")]
    assert cycles({"x": ["y"], "y": []}) == []


def _defined_names(tree: ast.Module) -> set[str] | None:
    """Names a module binds at its top level (definitions, assignments, imports, and names bound
    under top-level ``if``/``try``), or None when it defines a module ``__getattr__`` (any
    name may resolve)."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            names.add(n.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    names.add(a.asname or a.name.split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):
                for part in ("body", "orelse", "finalbody"):
                    visit(getattr(node, part, []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)

    visit(tree.body)
    return None if "__getattr__" in names else names


def test_every_name_imported_from_a_repo_module_exists_there():
    """``from M import a`` anywhere in the repository's packages (a module level or a function's
    import) names something module ``M`` binds at its top level, or a submodule of package
    ``M``: a moved or renamed helper breaks at this test, not in the first run that reaches a
    lazy import."""
    import importlib.util

    mods = module_files(REPO, PACKAGES + ("experiments", "gpu_validation", "tests"))
    trees = {m: ast.parse(f.read_text()) for m, f in mods.items()}
    defined = {m: _defined_names(t) for m, t in trees.items()}
    missing, checked = [], 0
    for m, tree in trees.items():
        is_pkg = mods[m].name == "__init__.py"
        pkg = m if is_pkg else m.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            src = (importlib.util.resolve_name("." * node.level + (node.module or ""), pkg)
                   if node.level else node.module)
            if src not in mods or defined[src] is None:
                continue
            for a in node.names:
                if a.name == "*":
                    continue
                checked += 1
                if a.name not in defined[src] and f"{src}.{a.name}" not in mods:
                    missing.append(f"{mods[m].relative_to(REPO)}:{node.lineno}: "
                                   f"from {src} import {a.name}")
    assert checked > 500
    assert not missing, "names not found:\n" + "\n".join(missing)
