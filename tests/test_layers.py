"""The layers of DESIGN.md, enforced: who may import whom, and no import cycles anywhere.

hardware/ knows devices (never Prefect or MLflow), blocks/ knows configuration, tasks/
knows work, flows/ knows order; the CLI, the benches and the tour sit on top. The rules
are read from the source with ``ast`` (nothing is imported), so a failure names the file,
the line and the import that broke them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("hardware", "blocks", "tasks", "flows")
TOP = "top"  # gpuflow.cli, gpuflow.bench, gpuflow.tour, gpuflow.controlplane, ...

# What each layer may import of gpuflow (its own layer always).
ALLOWED: dict[str, set[str]] = {
    "hardware": set(),
    "blocks": {"hardware"},
    "tasks": {"hardware", "blocks"},
    "flows": {"tasks", "blocks"},
    TOP: {"hardware", "blocks", "tasks", "flows"},
}
# Third-party packages a layer must not import (first dotted component).
FORBIDDEN: dict[str, set[str]] = {"hardware": {"prefect", "mlflow"}}


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported name, resolved to a gpuflow module where it is one
    path: str  # relative to the tree's root
    line: int


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every gpuflow module of the checkout, by its installed name (setup.py's mapping)."""
    bases = {"gpuflow": root / "gpuflow"} | {f"gpuflow.{layer}": root / layer for layer in LAYERS}
    modules: dict[str, Path] = {}
    for prefix, base in bases.items():
        for path in sorted(base.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([prefix, *parts])] = path
    return modules


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else TOP


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk_imports(tree: ast.AST):
    """Import nodes, lazy ones in functions included, ``if TYPE_CHECKING:`` blocks skipped."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            stack.append(child)


def imports_of(module: str, path: Path, modules: dict[str, Path], root: Path) -> list[Import]:
    rel = str(path.relative_to(root))
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in _walk_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` imports the module pkg.mod when there is one.
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        found += [Import(module, name, rel, node.lineno) for name in names]
    return found


def all_imports(root: Path = ROOT) -> list[Import]:
    modules = module_files(root)
    return [imp for mod, path in modules.items() for imp in imports_of(mod, path, modules, root)]


def layer_violations(imports: list[Import]) -> list[str]:
    bad = []
    for imp in imports:
        src = layer_of(imp.source)
        top_name = imp.target.split(".")[0]
        where = f"{imp.path}:{imp.line}: {imp.source} imports {imp.target}"
        if top_name == "gpuflow":
            dst = layer_of(imp.target)
            if dst != src and dst not in ALLOWED[src]:
                bad.append(f"{where} ({src} may not import {dst})")
        elif top_name in FORBIDDEN.get(src, set()):
            bad.append(f"{where} ({src} may not import {top_name})")
    return bad


def import_cycles(imports: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.target.startswith("gpuflow.") and imp.target != imp.source:
            graph.setdefault(imp.source, set()).add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # the graph is a few hundred modules: recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def _describe(cycle: list[str], imports: list[Import]) -> str:
    members = set(cycle)
    edges = [
        f"  {imp.path}:{imp.line}: {imp.source} -> {imp.target}"
        for imp in imports
        if imp.source in members and imp.target in members
    ]
    return " <-> ".join(cycle) + "\n" + "\n".join(edges)


def test_every_layer_folder_is_a_module_of_gpuflow():
    modules = module_files()
    for layer in LAYERS:
        assert f"gpuflow.{layer}" in modules, f"{layer}/__init__.py is missing"
    assert "gpuflow.cli" in modules


def test_layers_import_only_what_they_may():
    bad = layer_violations(all_imports())
    assert not bad, "imports that cross the layers:\n" + "\n".join(bad)


def test_no_import_cycles():
    imports = all_imports()
    cycles = import_cycles(imports)
    assert not cycles, "import cycles:\n" + "\n".join(_describe(c, imports) for c in cycles)


# -- the checker itself, on a tree the test writes -----------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for folder in ("gpuflow", *LAYERS):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    return tmp_path


def test_checker_names_prefect_under_hardware(tree: Path):
    (tree / "hardware" / "nvml.py").write_text("import os\n\nimport prefect\n")
    bad = [v for v in layer_violations(all_imports(tree)) if "prefect" in v]
    assert bad == [
        "hardware/nvml.py:3: gpuflow.hardware.nvml imports prefect (hardware may not import prefect)"
    ]


def test_checker_names_an_upward_import_and_ignores_type_checking(tree: Path):
    (tree / "tasks" / "work.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gpuflow.flows import train\n"
        "def later():\n    from gpuflow.flows.train import train\n"
    )
    (tree / "flows" / "train.py").write_text("train = 1\n")
    assert layer_violations(all_imports(tree)) == [
        "tasks/work.py:5: gpuflow.tasks.work imports gpuflow.flows.train (tasks may not import flows)"
    ]


def test_checker_finds_a_cycle_through_relative_and_lazy_imports(tree: Path):
    (tree / "tasks" / "a.py").write_text("from . import b\n")
    (tree / "tasks" / "b.py").write_text("def f():\n    import gpuflow.tasks.a\n")
    (tree / "tasks" / "c.py").write_text("from gpuflow.tasks import a\n")
    assert import_cycles(all_imports(tree)) == [["gpuflow.tasks.a", "gpuflow.tasks.b"]]
