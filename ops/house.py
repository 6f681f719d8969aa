"""The house check: the repository's shape in figures, stdlib only (it imports nothing of the project, so it runs
before any install). Lines and modules per package, the biggest file, imports that go up a floor, circles, the
longest import chain inside flywheel/, and modules over the line bound. tests/test_layering.py asserts on the same
functions; docs/architecture.md shows the table this prints.

Usage, from the repository root:  python3 ops/house.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

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


def modules(package: str, root: Path = ROOT) -> list[Path]:
    return sorted((root / package).rglob("*.py"))


def violations(package: str, root: Path = ROOT) -> list[str]:
    """Imports of `package`'s modules that go to its own floor (a sibling) or above."""
    floor, found = FLOORS[package], []
    for path in modules(package, root):
        for line, module in imports_of(path):
            top = module.split(".")[0]
            if top == package or top not in FLOORS:
                continue
            if FLOORS[top] >= floor:
                where = "a sibling on floor" if FLOORS[top] == floor else "floor"
                found.append(f"{path.relative_to(root)}:{line} imports {module} ({where} {FLOORS[top]})")
    return found


# Inside a package: no module imports another that (directly or not) imports it back. Inside flywheel/ the
# wings are floors of their own, and an import chain is at most MAX_CHAIN modules long (cli -> command ->
# building block): each command reads top to bottom, not through a tower of modules.
WINGS: dict[str, int] = {"admin": 1, "gathering": 1, "experiments": 2, "run": 3, "bench": 4, "chaos": 4, "soak": 5}
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


MAX_FILE_LINES = 500  # a module a newcomer reads in one sitting


def file_lines(root: Path = ROOT) -> dict[str, int]:
    """Lines of every module outside tests/ (and .git), by path."""
    return {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in root.rglob("*.py")
            if not {".git", "tests", ".venv"} & set(p.relative_to(root).parts)}  # fmt: skip


def figures(root: Path = ROOT) -> dict:
    """The house's figures: per package its modules, lines and biggest module; the whole's arrows up, circles,
    longest chain in flywheel/ and the modules over MAX_FILE_LINES."""
    lines, graph = file_lines(root), module_graph(root)
    packages = {}
    for package in FLOORS:
        mine = {p: n for p, n in lines.items() if p.split("/")[0] == package}
        biggest = max(mine, key=mine.get)
        packages[package] = {"floor": FLOORS[package], "modules": len(mine), "lines": sum(mine.values()),
                             "biggest": biggest, "biggest_lines": mine[biggest]}  # fmt: skip
    up = [v for package in FLOORS for v in violations(package, root)] + wing_violations(graph)
    over = {p: n for p, n in sorted(lines.items()) if n > MAX_FILE_LINES and p.split("/")[0] in FLOORS}
    return {
        "packages": packages,
        "arrows_up": up,
        "circles": circles(graph),
        "longest_chain": longest_chain(graph, "flywheel"),
        "over_the_bound": over,
    }


def main() -> int:
    found = figures()
    print("| floor | package | modules | lines | biggest module |")
    print("|---|---|---|---|---|")
    for package, f in found["packages"].items():
        biggest = f"`{f['biggest']}` ({f['biggest_lines']})"
        print(f"| {f['floor']} | `{package}/` | {f['modules']} | {f['lines']:,} | {biggest} |")
    total = sum(f["lines"] for f in found["packages"].values())
    print(f"\n{total:,} lines in {sum(f['modules'] for f in found['packages'].values())} modules; "
          f"arrows up: {len(found['arrows_up'])}; circles: {len(found['circles'])}; longest chain in flywheel/: "
          f"{len(found['longest_chain'])} modules; over {MAX_FILE_LINES} lines: "
          + (", ".join(f"`{p}` ({n})" for p, n in found["over_the_bound"].items()) or "none"))  # fmt: skip
    for problem in found["arrows_up"] + [" <-> ".join(c) for c in found["circles"]]:
        print(f"  {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
