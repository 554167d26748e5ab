"""The harness is used through its package, and pytest never mistakes it for tests.

Tests and benchmarks import ``tests.harness`` only, so its modules can be
split or merged without touching every caller; a module named ``test_*``
inside it would be collected and run as a test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tests.harness

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "harness"


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_every_exported_name_exists() -> None:
    missing = [name for name in tests.harness.__all__ if not hasattr(tests.harness, name)]
    assert missing == []


def test_no_harness_module_looks_like_a_test() -> None:
    assert [p.name for p in HARNESS.glob("test*.py")] == []


def test_callers_import_the_package_not_its_modules() -> None:
    callers = [p for folder in ("tests", "benchmarks") for p in sorted((ROOT / folder).rglob("*.py"))]
    reaching_in = {
        str(path.relative_to(ROOT)): sorted(m for m in _imported_modules(path) if m.startswith("tests.harness."))
        for path in callers
        if HARNESS not in path.parents
    }
    assert {path: modules for path, modules in reaching_in.items() if modules} == {}
