"""The layer contract of the tree, read from the import graph of the source (CONTRIBUTING.md).

Each first-party package may import only the packages listed for it, so the graph between
packages has no cycle: a new import that would close one fails here. Inside a package the
modules form no cycle either. Every import counts, function-local and TYPE_CHECKING ones too,
and other packages of the project are imported at the top of modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> the first-party packages it may import (besides itself), lowest layer first.
ALLOWED = {
    "spark_runtime": set(),
    "jobs": {"spark_runtime"},
    "infra": {"spark_runtime"},
    "console": {"infra", "spark_runtime"},
    "workers": {"console", "infra", "spark_runtime"},
    "bench": {"console", "infra", "spark_runtime"},
    "web": {"console", "infra", "spark_runtime"},
}
# Third-party packages a layer must not import: the infrastructure and the data plane run where
# no Django is configured (stage processes, the launcher before any settings exist).
FORBIDDEN_THIRD_PARTY = {"spark_runtime": {"django", "rest_framework"}, "infra": {"django"}}


def source_files(package: str) -> list[Path]:
    return sorted(path for path in (ROOT / package).rglob("*.py") if "migrations" not in path.parts)


def imports_of(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at the module's top level) for every import in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.extend((name, node.lineno, id(node) in top_level) for name in names)
    return found


def package_graph() -> dict[str, set[str]]:
    graph = {package: set() for package in ALLOWED}
    for package in ALLOWED:
        for path in source_files(package):
            for name, _, _ in imports_of(path):
                top = name.split(".")[0]
                if top in ALLOWED and top != package:
                    graph[package].add(top)
    return graph


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_layers_below_it(package):
    wrong = []
    for path in source_files(package):
        for name, line, _ in imports_of(path):
            top = name.split(".")[0]
            allowed = ALLOWED[package] | {package}
            if (top in ALLOWED and top not in allowed) or top in FORBIDDEN_THIRD_PARTY.get(
                package, ()
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package])}:\n" + "\n".join(wrong)


def test_the_package_graph_has_no_cycle():
    graph = package_graph()
    visiting, done = set(), set()

    def visit(package: str, path: list[str]) -> None:
        if package in done:
            return
        assert package not in visiting, "import cycle: " + " -> ".join([*path, package])
        visiting.add(package)
        for imported in sorted(graph[package]):
            visit(imported, [*path, package])
        visiting.discard(package)
        done.add(package)

    for package in sorted(graph):
        visit(package, [])


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_other_packages_are_imported_at_the_top_of_modules(package):
    """Function-local imports hid the console <-> workers cycle. Within a package a module may
    still import another lazily (a stage process defers PySpark until it needs it; Django's
    AppConfig.ready imports what needs the app registry)."""
    local = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in source_files(package)
        for name, line, top_level in imports_of(path)
        if not top_level and name.split(".")[0] in ALLOWED.keys() - {package}
    ]
    assert not local, "import at the top of the module instead:\n" + "\n".join(local)


def test_the_contract_sees_real_imports():
    """The graph is read from the source, not assumed: the known edges are there."""
    graph = package_graph()
    assert "spark_runtime" in graph["console"]
    assert "console" in graph["workers"]
    assert "infra" in graph["console"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph() -> dict[str, set[str]]:
    """First-party module -> the first-party modules it imports. `from a.b import c` imports the
    module a.b.c when there is one, else a.b; an import of a package is an import of its
    __init__."""
    modules = {module_name(path): path for package in ALLOWED for path in source_files(package)}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package upwards
                    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}".rstrip(".")
                names = [f"{base}.{alias.name}" for alias in node.names] + [base]
            else:
                continue
            targets.update(target for name in names if (target := known(name)))
        graph[module] = targets - {module}
    return graph


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_module_imports_itself_through_others():
    """Layers inside packages too: a cycle hidden by a function-local or TYPE_CHECKING import
    is still a cycle (the first would fail at import time if it were moved to the top)."""
    graph = module_graph()
    cycles = [
        " <-> ".join(f"{m} (imports {', '.join(sorted(graph[m] & set(c)))})" for m in c)
        for c in cycles_of(graph)
    ]
    assert not cycles, "module import cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles_of(graph) == [["a", "b", "c"]]
    assert "spark_runtime.replicas" in module_graph()["spark_runtime.supervision"]


def test_the_api_and_the_services_do_not_import_the_pages():
    """The REST API and the services read through console.services (queries.py for the job
    list and the fleet's totals), never through a Dash page's module: pages sit on top."""
    graph = module_graph()
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.startswith(("console.api", "console.services"))
        for target in targets
        if target.startswith("console.dash")
    )
    assert not wrong, "\n".join(wrong)
