"""The package boundaries of DESIGN.md: rewards and samplers never import flowrl."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module.split(".")[0])
    return modules


@pytest.mark.parametrize("package", ["rewards", "samplers"])
def test_package_never_imports_flowrl(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    offenders = [str(f.relative_to(ROOT)) for f in files if "flowrl" in _imported_modules(f)]
    assert not offenders


def test_samplers_depend_on_torch_only():
    allowed = {"torch", "samplers", "__future__", "typing", "collections", "dataclasses", "math"}
    for path in (ROOT / "samplers").rglob("*.py"):
        assert _imported_modules(path) <= allowed, (path, _imported_modules(path) - allowed)
