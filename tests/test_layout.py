"""The package boundaries, checked from the source: who may import whom.

``gpuwarden`` is the shared core; ``agent`` and ``scheduler`` import it and
never each other, and the core imports neither (its CLI finds their
subcommands through entry points). ``demo`` runs the whole system, so it is
the one package that may import all three, and nothing imports it. The scheduler's engine and the core of
remediation are pure: no Kubernetes client, and no import circle between its modules, so each can be
read, tested and replaced on its own. Imports inside functions count too: a
late import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gpuwarden", "agent", "scheduler", "demo")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Project modules that ``name`` imports, resolved to the longest known module name."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_pkg else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts:
                yield ".".join(parts)
                break


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: {t for t in _imports(name, path, known) if t != name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def test_agent_and_scheduler_never_import_each_other_and_the_core_imports_neither() -> None:
    allowed = {
        "gpuwarden": {"gpuwarden"},
        "agent": {"gpuwarden", "agent"},
        "scheduler": {"gpuwarden", "scheduler"},
        "demo": {"gpuwarden", "agent", "scheduler", "demo"},
    }
    crossings = sorted(
        f"{src} -> {dst}" for src, dsts in _graph().items() for dst in dsts if _top(dst) not in allowed[_top(src)]
    )
    assert crossings == []


def test_nothing_but_the_demo_imports_the_demo() -> None:
    graph = _graph()
    importers = sorted(src for src, dsts in graph.items() for dst in dsts if _top(dst) == "demo" != _top(src))
    assert importers == []


def test_no_import_cycle_between_modules() -> None:
    # Package __init__ modules are left out: importing a submodule runs its
    # package's __init__, which is not a dependency the submodule chose.
    graph = {
        src: {d for d in dsts if not (ROOT / d.replace(".", "/") / "__init__.py").exists()}
        for src, dsts in _graph().items()
    }
    assert _cycles(graph) == []


def test_the_scheduler_packages_depend_only_downward() -> None:
    """engine <- cluster <- remediation <- the process wiring (runner, CLI): never back up.

    Modules directly in ``scheduler`` (the runner, the CLI) may use every
    subpackage; a subpackage may use only those below it.
    """
    order = ["scheduler.engine", "scheduler.cluster", "scheduler.remediation"]

    def level(module: str) -> int:
        for i, package in enumerate(order):
            if module == package or module.startswith(package + "."):
                return i
        return len(order) if module.startswith("scheduler.") else -1

    upward = sorted(
        f"{src} -> {dst}"
        for src, dsts in _graph().items()
        if _top(src) == "scheduler"
        for dst in dsts
        if _top(dst) == "scheduler" and level(dst) > level(src) and src != "scheduler"
    )
    assert upward == []


# The remediation modules that must stay pure (its controller, which talks to
# the cluster, is the one module of the package not listed).
PURE_REMEDIATION = ("__init__", "model", "observations", "policy", "breaker", "steps", "machine")


def _impure_imports(paths: list[Path], allowed: tuple[str, ...]) -> list[str]:
    """Imports of ``paths`` that reach Kubernetes, the agent, or project modules outside ``allowed``."""
    outside = set()
    for path in paths:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for mod in names:
                top = mod.split(".", 1)[0]
                if top in {"kubernetes", "agent"} or (top in PACKAGES and not mod.startswith(allowed)):
                    outside.add(f"{shown}: {mod}")
    return sorted(outside)


def test_the_engine_imports_no_kubernetes_and_from_the_core_only_the_contract_and_logging() -> None:
    paths = sorted((ROOT / "scheduler" / "engine").rglob("*.py"))
    assert _impure_imports(paths, ("scheduler.engine", "gpuwarden.contract", "gpuwarden.logconfig")) == []


def test_the_remediation_core_is_as_pure_as_the_engine() -> None:
    paths = [ROOT / "scheduler" / "remediation" / f"{name}.py" for name in PURE_REMEDIATION]
    assert all(p.exists() for p in paths)
    # gpuwarden.flags declares the bounds of a setting once for flags and files
    # (Bounds, bounded, check_bounds): plain data and checks, no I/O.
    allowed = (
        "scheduler.remediation",
        "scheduler.engine",
        "gpuwarden.contract",
        "gpuwarden.logconfig",
        "gpuwarden.flags",
    )
    assert _impure_imports(paths, allowed) == []


def test_the_purity_check_finds_a_kubernetes_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import kubernetes.client\nfrom gpuwarden.kube import KubeApi\nfrom gpuwarden.contract import Action\n"
    )
    found = _impure_imports([bad], ("gpuwarden.contract",))
    assert [line.split(": ", 1)[1] for line in found] == ["gpuwarden.kube", "kubernetes.client"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
