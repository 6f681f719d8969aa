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


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    # The check itself can fail: a policy module importing the learner is reported.
    fake_root = tmp_path
    (fake_root / "policy").mkdir()
    (fake_root / "policy" / "bad.py").write_text("def f():\n    from learner.model.vla import VLA\n")
    monkeypatch.setitem(globals(), "ROOT", fake_root)
    assert violations("policy") == ["policy/bad.py:2 imports learner.model.vla (floor 4)"]


# Inside a package: no module imports another that (directly or not) imports it back. Inside flywheel/ the
# wings are floors of their own, and an import chain is at most MAX_CHAIN modules long (cli -> command ->
# building block): each command reads top to bottom, not through a tower of modules.
WINGS: dict[str, int] = {"admin": 1, "gathering": 1, "experiments": 2, "run": 3, "bench": 4, "chaos": 4}
MAX_CHAIN = 3


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(root: Path) -> dict[str, set[str]]:
    """module -> the repository modules it imports (`from a.b import c` counts a.b.c when c is a module)."""
    names = {module_name(p, root): p for package in FLOORS for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in names:
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(names)
                edges |= subs or {node.module}
        graph[name] = edges - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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


def longest_chain(graph: dict[str, set[str]], inside: str) -> list[str]:
    """The longest import chain among the modules under `inside` (an acyclic graph), as its modules."""
    local = {v: {w for w in ws if w.startswith(inside + ".")} for v, ws in graph.items() if v.startswith(inside + ".")}
    best: dict[str, list[str]] = {}

    def chain(v: str) -> list[str]:
        if v not in best:
            best[v] = [v] + max((chain(w) for w in local[v]), key=len, default=[])
        return best[v]

    return max((chain(v) for v in sorted(local)), key=len, default=[])


def wing_violations(graph: dict[str, set[str]]) -> list[str]:
    """flywheel.<wing> modules importing a wing on their floor (another one) or above."""
    found = []
    for v, ws in sorted(graph.items()):
        mine = v.split(".")[1] if v.startswith("flywheel.") and v.count(".") >= 2 else None
        for w in sorted(ws):
            theirs = w.split(".")[1] if w.startswith("flywheel.") and w.count(".") >= 2 else None
            if mine in WINGS and theirs in WINGS and mine != theirs and WINGS[theirs] >= WINGS[mine]:
                found.append(f"{v} imports {w} (wing {theirs} is not below {mine})")
    return found


def test_no_module_imports_itself_back():
    assert circles(module_graph(ROOT)) == []


def test_flywheel_is_in_wings_each_importing_only_downward():
    tops = {p.name for p in (ROOT / "flywheel").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert tops == set(WINGS)
    loose = sorted(p.name for p in (ROOT / "flywheel").glob("*.py") if p.name not in ("__init__.py", "cli.py"))
    assert loose == [], f"flywheel/ modules outside a wing: {loose}"
    assert wing_violations(module_graph(ROOT)) == []


MAX_FILE_LINES = 600  # a module a newcomer reads in one sitting
# Modules over the bound today, each held at its size until it is split by meaning (none may grow, none be added).
OVER_THE_BOUND = {"edge_client/env.py": 625, "flywheel/cli.py": 680, "edge_client/experts.py": 684,
                  "flywheel/experiments/curriculum.py": 917}  # fmt: skip


def test_no_module_is_longer_than_the_bound_and_none_over_it_grows():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")
             if not {".git", "tests"} & set(p.relative_to(ROOT).parts)}  # fmt: skip
    over = {path: n for path, n in sizes.items() if n > OVER_THE_BOUND.get(path, MAX_FILE_LINES)}
    assert not over, f"modules over {MAX_FILE_LINES} lines (or grown past their size in OVER_THE_BOUND): {over}"


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
