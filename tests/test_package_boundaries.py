"""The package boundaries of docs/ARCHITECTURE.md, checked on the source text (no imports run).

- ``rewards`` and ``samplers`` never import ``flowrl``; samplers depend on torch only;
- the world specification (``rewards/world_spec.py``) is a leaf: standard library only;
- no import cycle among the project's modules and scripts, type-only imports (``if TYPE_CHECKING:``)
  included: a circle of type hints is a design tie all the same (imports inside functions are
  deliberate late imports, and are not counted);
- no source file over ``MAX_LINES`` lines unless its docstring says why ("Longer than ...");
- the training step reads on one screen: ``Trainer.train_step`` at most ``MAX_STEP_LINES`` lines and
  ``trainer.py`` at most ``MAX_TRAINER_LINES`` (what the step calls lives in the modules beside it).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("flowrl", "rewards", "samplers", "app")
MAX_LINES = 400
MAX_STEP_LINES = 50
MAX_TRAINER_LINES = 560


def _imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module.split(".")[0])
    return modules


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _source_files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def _script_files() -> dict[str, Path]:
    """``scripts/*.py`` by module name ``scripts.<stem>`` (they import each other by bare name)."""
    return {f"scripts.{path.stem}": path for path in sorted((ROOT / "scripts").glob("*.py"))}


def _module_level_imports(path: Path, known: set[str]) -> set[str]:
    """Project modules ``path`` imports when it is imported or type-checked (top level, ``if`` blocks,
    ``if TYPE_CHECKING:`` included, and ``try`` blocks; not functions or classes). ``from a import b``
    counts ``a.b`` when that is a module; in ``scripts/``, ``import x`` of a sibling counts ``scripts.x``."""
    found: set[str] = set()
    sibling = "scripts." if path.parent == ROOT / "scripts" else None

    def add(name: str) -> None:
        found.add(name)
        if sibling:
            found.add(sibling + name)

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(ast.parse(path.read_text()).body)
    # importing a.b.c imports the packages a and a.b first
    with_parents = {".".join(name.split(".")[:i]) for name in found for i in range(1, name.count(".") + 2)}
    return with_parents & known


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


def test_the_world_specification_is_a_leaf():
    assert _imported_modules(ROOT / "rewards" / "world_spec.py") <= {"__future__", "math"}


def test_there_is_no_import_cycle():
    files = {**{_module_name(path): path for path in _source_files()}, **_script_files()}
    graph = {name: _module_level_imports(path, set(files)) - {name} for name, path in files.items()}
    # a package imports its own __init__ first, so a module importing its package is no edge back
    graph = {name: {dep for dep in deps if not name.startswith(dep + ".")} for name, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    """The checker above is not vacuous: two modules importing each other are reported."""
    package = tmp_path / "flowrl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from flowrl.b import x\n")
    (package / "b.py").write_text("import flowrl.a\nx = 1\n")
    (tmp_path / "scripts").mkdir()
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "PACKAGES", ("flowrl",))
    with pytest.raises(AssertionError, match="import cycle: flowrl.a -> flowrl.b -> flowrl.a"):
        test_there_is_no_import_cycle()
    # a type-only import closes a circle too
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import flowrl.a\nx = 1\n"
    )
    with pytest.raises(AssertionError, match="import cycle"):
        test_there_is_no_import_cycle()
    # and so do two scripts importing each other by bare name
    (package / "b.py").write_text("x = 1\n")
    test_there_is_no_import_cycle()
    (tmp_path / "scripts" / "report.py").write_text("import bench\n")
    (tmp_path / "scripts" / "bench.py").write_text("from report import write\n")
    with pytest.raises(
        AssertionError, match="import cycle: scripts.bench -> scripts.report -> scripts.bench"
    ):
        test_there_is_no_import_cycle()


def test_no_file_is_long_without_a_stated_reason():
    long_files = []
    for path in [*_source_files(), *(ROOT / "scripts").glob("*.py"), *(ROOT / "tests").glob("*.py")]:
        if len(path.read_text().splitlines()) <= MAX_LINES:
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if "Longer than" not in docstring:
            long_files.append(str(path.relative_to(ROOT)))
    assert not long_files, (
        f"over {MAX_LINES} lines with no 'Longer than ...' reason in the docstring: {long_files}"
    )


def test_the_training_step_fits_on_one_screen():
    path = ROOT / "flowrl" / "trainer.py"
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_TRAINER_LINES, f"trainer.py is over {MAX_TRAINER_LINES} lines"
    trainer = next(
        node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == "Trainer"
    )
    step = next(
        node for node in trainer.body if isinstance(node, ast.FunctionDef) and node.name == "train_step"
    )
    lines = step.end_lineno - step.lineno + 1
    assert lines <= MAX_STEP_LINES, f"Trainer.train_step is {lines} lines, over {MAX_STEP_LINES}"
