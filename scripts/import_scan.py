"""Import circles and upward imports among edge_runtime's modules, read from the source with `ast`.

    python scripts/import_scan.py            # facts, then each circle and each upward import
    python scripts/import_scan.py --edges    # also every internal import, one a line
    python scripts/import_scan.py --root OLD_TREE --contracts pyproject.toml   # another tree, these layers

Every import counts, those inside functions included: a lazy import is still a dependency, and two modules
that import each other lazily are still one unit that cannot be understood (or moved) apart. Imports under
`if TYPE_CHECKING:` are listed but not counted: they never run.

The layers are read from pyproject.toml's import-linter contracts (`[tool.importlinter]`, the same ones
`lint-imports` checks in CI), so this scan and CI agree on what "upward" means; a module no layer names is
not judged. Unlike import-linter, which reads only the `edge_runtime` folder, the scan also covers the folders
mapped into the namespace (exporters/, models/, targets/). It needs nothing but Python 3.11's standard library.

It also lists how the front ends (edge_runtime.cli, .serve, .bench) reach generation: every one of them
should go through `stream_generate` (or `generate`, which consumes it), never through a decode loop
(`generate_step`, `speculative_generate_step`, `step_generator`) or a `Session.send`.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import tomllib

PACKAGE = "edge_runtime"
FRONT_ENDS = ("edge_runtime.cli", "edge_runtime.serve", "edge_runtime.bench")
STREAM = {"stream_generate", "generate"}  # the way in for front ends
LOOPS = {"generate_step", "generate_steps", "speculative_generate_step", "step_generator"}  # the way below it
LOOP_METHODS = {"send", "steps"}  # Session.send, SpeculativeDecoder.steps (attribute calls)


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    in_function: bool
    type_checking: bool


def module_files(root: Path, pyproject: dict) -> dict[str, Path]:
    """Module name -> file, with the top-level folders setuptools maps into the namespace (package-dir)."""
    dirs = pyproject.get("tool", {}).get("setuptools", {}).get("package-dir", {PACKAGE: PACKAGE})
    out: dict[str, Path] = {}
    for name, folder in dirs.items():
        base = root / folder
        for f in sorted(base.rglob("*.py")):
            rel = f.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            # Only folders that are packages (an __init__.py all the way down) are importable modules.
            if any(not (base.joinpath(*rel.parts[:i]) / "__init__.py").exists() for i in range(1, len(rel.parts))):
                continue
            out[".".join([*name.split("."), *parts])] = f
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(module: str, path: Path, known: set[str]) -> list[Edge]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    edges: list[Edge] = []

    def target(name: str) -> str | None:
        """The longest known module `name` starts with (importing a.b.c runs a.b.c; an attribute is its module's)."""
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            candidate = ".".join(parts[:i])
            if candidate in known:
                return candidate
        return None

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            fn = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, fn, True)
                for stmt in child.orelse:
                    visit_stmt(stmt, fn, type_checking)
                continue
            visit_stmt(child, fn, type_checking)

    def visit_stmt(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join([*base, *([node.module] if node.module else [])])
            else:
                stem = node.module or ""
            # `from pkg import mod` imports pkg.mod when it is a module; `from mod import attr` imports mod.
            names = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
        for name in dict.fromkeys(names):
            dst = target(name)
            if dst is not None and dst != module:
                edges.append(Edge(module, dst, node.lineno, in_function, type_checking))
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            visit(node, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), type_checking)

    visit(tree, False, False)
    return edges


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(out)


def shortest_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One shortest circle through the component's first module (breadth-first), for the report."""
    members, start = set(comp), comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, set()) & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


@dataclass(frozen=True)
class Layers:
    """One import-linter layers contract: `layers` top first; "a | b" siblings are independent, "a : b" not."""

    name: str
    containers: tuple[str, ...]
    layers: tuple[tuple[str, ...], ...]
    independent: tuple[bool, ...]

    def place(self, module: str) -> tuple[int, str] | None:
        """(layer index, sibling) of `module`, the most specific match; None if no layer names it."""
        best: tuple[int, str, int] | None = None
        for container in self.containers or ("",):
            for i, siblings in enumerate(self.layers):
                for s in siblings:
                    full = f"{container}.{s}" if container else s
                    if (module == full or module.startswith(full + ".")) and (best is None or len(full) > best[2]):
                        best = (i, full, len(full))
        return None if best is None else best[:2]


def layer_contracts(pyproject: dict) -> list[Layers]:
    out = []
    for c in pyproject.get("tool", {}).get("importlinter", {}).get("contracts", []):
        if c.get("type") != "layers":
            continue
        layers, independent = [], []
        for entry in c["layers"]:
            sep = "|" if "|" in entry else ":"
            layers.append(tuple(s.strip().strip("()") for s in entry.split(sep)))
            independent.append(sep == "|")
        out.append(Layers(c.get("name", "layers"), tuple(c.get("containers", ())), tuple(layers), tuple(independent)))
    return out


def upward(edges: list[Edge], contracts: list[Layers]) -> list[tuple[str, Edge]]:
    """Imports from a lower layer to a higher one (or between independent siblings), per contract."""
    out = []
    for c in contracts:
        for e in edges:
            a, b = c.place(e.src), c.place(e.dst)
            if a is None or b is None:
                continue
            # Layers are listed top first: a smaller index is a higher layer.
            if b[0] < a[0] or (b[0] == a[0] and a[1] != b[1] and c.independent[a[0]]):
                out.append((c.name, e))
    return out


def generation_calls(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(name, line, through stream_generate) of each call a front-end module makes into generation."""
    if not module.startswith(FRONT_ENDS):
        return []
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            out += [(a.name, node.lineno, False) for a in node.names if a.name in LOOPS]
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in STREAM | LOOPS:
            out.append((f.id, node.lineno, f.id in STREAM))
        elif isinstance(f, ast.Attribute) and f.attr in LOOP_METHODS | LOOPS:
            out.append((f"{ast.unparse(f.value)}.{f.attr}", node.lineno, False))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--edges", action="store_true", help="print every internal import")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="the tree to scan")
    ap.add_argument("--contracts", type=Path, help="pyproject.toml with the layers [ROOT/pyproject.toml]")
    args = ap.parse_args()
    root = args.root.resolve()
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    layers_from = tomllib.loads(args.contracts.read_text(encoding="utf-8")) if args.contracts else pyproject
    contracts = layer_contracts(layers_from)
    files = module_files(root, pyproject)
    known = set(files)
    edges = [e for m, f in sorted(files.items()) for e in imports(m, f, known)]
    calls = [(m, *c) for m, f in sorted(files.items()) for c in generation_calls(m, f)]
    runtime = [e for e in edges if not e.type_checking]
    graph: dict[str, set[str]] = defaultdict(set)
    for e in runtime:
        graph[e.src].add(e.dst)
    comps = circles(graph)
    up = upward(runtime, contracts)
    around = [c for c in calls if not c[3]]

    print(f"modules: {len(files)}")
    print(
        f"internal imports: {len(runtime)} run-time ({sum(e.in_function for e in runtime)} inside functions), "
        f"{len(edges) - len(runtime)} under TYPE_CHECKING"
    )
    print(f"import circles (strongly connected groups of modules): {len(comps)}")
    for comp in comps:
        print(f"  {len(comp)} modules: {', '.join(comp)}")
        print(f"    e.g. {' -> '.join(shortest_cycle(graph, comp))}")
    print(f"upward imports ({len(contracts)} layers contract(s) in pyproject.toml): {len(up)}")
    for name, e in up:
        where = "in a function" if e.in_function else "at module level"
        print(f"  [{name}] {e.src} -> {e.dst} (line {e.line}, {where})")
    through = len(calls) - len(around)
    print(f"front-end calls into generation: {len(calls)}, {through} through stream_generate/generate, ", end="")
    print(f"{len(around)} around it")
    for m, name, line, _ in around:
        print(f"  {m}:{line} {name}")
    if args.edges:
        for e in edges:
            flags = " [function]" if e.in_function else ""
            flags += " [TYPE_CHECKING]" if e.type_checking else ""
            print(f"{e.src} -> {e.dst}:{e.line}{flags}")
    return 1 if comps or up or around else 0


if __name__ == "__main__":
    sys.exit(main())
