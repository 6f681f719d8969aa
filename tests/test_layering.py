"""The floors import only downward (docs/architecture.md), and the edge's floors stay free of the learner's
and the pipeline's heavy dependencies. Static: every import statement in every module, function-level ones
included, so a lazy import cannot hide an upward edge."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Floor of each top-level package; a package may import its own floor's package, and any lower floor, but
# not a sibling on its floor (siblings are independent) nor anything above.
FLOORS: dict[str, int] = {
    "schemas": 1,
    "core": 2,
    "streams": 3,
    "registry": 3,
    "policy": 3,
    "lake": 3,
    "edge_client": 4,
    "processors": 4,
    "learner": 4,
    "flywheel": 5,
}
# What an edge install lacks: these packages must never be imported by what the edge runs.
EDGE_PACKAGES = ("schemas", "core", "streams", "registry", "policy", "edge_client")
NOT_ON_THE_EDGE = {"torch", "transformers", "peft", "polars", "pyarrow", "deltalake", "faust", "aiokafka", "onnx"}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every absolute import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def violations(package: str) -> list[str]:
    floor, found = FLOORS[package], []
    for path in modules(package):
        for line, module in imports_of(path):
            top = module.split(".")[0]
            if top == package or top not in FLOORS:
                continue
            if FLOORS[top] >= floor:
                where = "a sibling on floor" if FLOORS[top] == floor else "floor"
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module} ({where} {FLOORS[top]})")
    return found


def test_every_package_is_on_a_floor():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == set(FLOORS), f"packages without a floor: {packages - set(FLOORS)}"


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_imports_go_only_downward(package):
    assert violations(package) == []


@pytest.mark.parametrize("package", EDGE_PACKAGES)
def test_the_edge_floors_import_none_of_the_heavy_dependencies(package):
    heavy = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in modules(package)
        for line, module in imports_of(path)
        if module.split(".")[0] in NOT_ON_THE_EDGE
    ]
    assert heavy == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    # The check itself can fail: a policy module importing the learner is reported.
    fake_root = tmp_path
    (fake_root / "policy").mkdir()
    (fake_root / "policy" / "bad.py").write_text("def f():\n    from learner.vla import VLA\n")
    monkeypatch.setitem(globals(), "ROOT", fake_root)
    assert violations("policy") == ["policy/bad.py:2 imports learner.vla (floor 4)"]
