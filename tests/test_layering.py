"""The floors import only downward (docs/architecture.md), and the edge's floors stay free of the learner's
and the pipeline's heavy dependencies. Static: every import statement in every module, function-level ones
included, so a lazy import cannot hide an upward edge."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The house check's functions (ops/house.py, stdlib only: no install needed to run it).
_spec = importlib.util.spec_from_file_location("house", ROOT / "ops" / "house.py")
house = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(house)
FLOORS, WINGS, MAX_CHAIN, MAX_FILE_LINES = house.FLOORS, house.WINGS, house.MAX_CHAIN, house.MAX_FILE_LINES
EDGE_PACKAGES, NOT_ON_THE_EDGE = house.EDGE_PACKAGES, house.NOT_ON_THE_EDGE
imports_of, modules, violations, module_graph = house.imports_of, house.modules, house.violations, house.module_graph
circles, longest_chain, wing_violations = house.circles, house.longest_chain, house.wing_violations


def test_every_package_is_on_a_floor():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == set(FLOORS), f"packages without a floor: {packages - set(FLOORS)}"


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_every_room_opens_with_what_it_is_for(package):
    """A newcomer opening a package sees first what it holds (its __init__'s docstring)."""
    doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text()))
    assert doc and len(doc.split()) >= 8, f"{package}/__init__.py has no opening line saying what {package}/ is for"


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


def test_the_check_sees_an_upward_import(tmp_path):
    # The check itself can fail: a policy module importing the learner is reported.
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "bad.py").write_text("def f():\n    from learner.model.vla import VLA\n")
    assert violations("policy", tmp_path) == ["policy/bad.py:2 imports learner.model.vla (floor 4)"]


# Inside a package: no module imports another that (directly or not) imports it back. Inside flywheel/ the
def test_no_module_imports_itself_back():
    assert circles(module_graph(ROOT)) == []


def test_flywheel_is_in_wings_each_importing_only_downward():
    tops = {p.name for p in (ROOT / "flywheel").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert tops == set(WINGS)
    loose = sorted(p.name for p in (ROOT / "flywheel").glob("*.py") if p.name not in ("__init__.py", "cli.py"))
    assert loose == [], f"flywheel/ modules outside a wing: {loose}"
    assert wing_violations(module_graph(ROOT)) == []


def test_no_module_is_longer_than_the_bound():
    over = {path: n for path, n in house.file_lines(ROOT).items() if n > MAX_FILE_LINES}
    assert not over, f"modules over {MAX_FILE_LINES} lines (split them by meaning): {over}"


def test_no_import_chain_inside_flywheel_is_deeper_than_three():
    chain = longest_chain(module_graph(ROOT), "flywheel")
    assert len(chain) <= MAX_CHAIN, " -> ".join(chain)


def test_the_graph_checks_see_a_circle_a_deep_chain_and_an_upward_wing(tmp_path, monkeypatch):
    for package in FLOORS:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "policy" / "a.py").write_text("from policy.b import x\n")
    (tmp_path / "policy" / "b.py").write_text("def f():\n    import policy.a\n")
    for wing in ("run", "admin"):
        (tmp_path / "flywheel" / wing).mkdir()
        (tmp_path / "flywheel" / wing / "__init__.py").write_text("")
    (tmp_path / "flywheel" / "cli.py").write_text("from flywheel.run import demo\n")
    (tmp_path / "flywheel" / "run" / "demo.py").write_text("from flywheel.run.fleet import run_fleet\n")
    (tmp_path / "flywheel" / "run" / "fleet.py").write_text("from flywheel.run import stack\n")
    (tmp_path / "flywheel" / "run" / "stack.py").write_text("")
    (tmp_path / "flywheel" / "admin" / "status.py").write_text("from flywheel.run.stack import LocalStack\n")
    graph = module_graph(tmp_path)
    assert circles(graph) == [["policy.a", "policy.b"]]
    assert longest_chain(graph, "flywheel") == ["flywheel.cli", "flywheel.run.demo", "flywheel.run.fleet",
                                                "flywheel.run.stack"]  # fmt: skip
    assert wing_violations(graph) == ["flywheel.admin.status imports flywheel.run.stack (wing run is not below admin)"]


def test_code_says_why_not_which_ticket():
    """A comment or docstring names the reason, never an issue or session number (they mean nothing to a newcomer)."""
    import re

    ticket = re.compile(r"\b(issues?|session)s? \d", re.IGNORECASE)
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted(ROOT.rglob("*.py")) if ".git" not in p.parts
             for i, line in enumerate(p.read_text().splitlines(), 1) if ticket.search(line)]  # fmt: skip
    assert found == []


def test_the_architectures_map_names_every_package_on_its_floor():
    """docs/architecture.md's table of packages is the tree's: every package once, on the floor this test holds."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    floors = text[text.index("\n## Floors") : text.index("\n## ", text.index("\n## Floors") + 1)]
    rows = re.findall(r"^\| (\d) \| `(\w+)/` \|", floors, flags=re.MULTILINE)
    assert {package: int(floor) for floor, package in rows} == FLOORS
    assert len(rows) == len(FLOORS)


def test_every_doc_the_code_cites_exists():
    """A comment's or help text's docs/... reference leads somewhere (docs move; the code's pointers move with them)."""
    import re

    cited = {(str(p.relative_to(ROOT)), ref) for p in sorted(ROOT.rglob("*.py")) if ".git" not in p.parts
             for ref in re.findall(r"docs/[\w/-]+\.md", p.read_text())}  # fmt: skip
    assert [f"{where}: {ref}" for where, ref in sorted(cited) if not (ROOT / ref).exists()] == []


def current_docs() -> list[Path]:
    """The docs that describe the system as it is: the README and docs/*.md but the history."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "history.md")]


def test_the_current_docs_are_short_and_name_no_ticket():
    import re

    ticket = re.compile(r"\b(issues?|session)s? \d", re.IGNORECASE)
    lines = {p.name: p.read_text().splitlines() for p in current_docs()}
    assert sum(len(v) for v in lines.values()) <= 1500, {k: len(v) for k, v in lines.items()}
    assert [
        f"{name}:{i}" for name, text in lines.items() for i, line in enumerate(text, 1) if ticket.search(line)
    ] == []
