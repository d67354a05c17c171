"""The engine's shape (DESIGN.md section 4): no import cycle inside relax/, and relax/ imports no harness.

Imports are read from the source (AST), function-level and `if TYPE_CHECKING:` ones included: a lazy or a
type-only import that closes a cycle still ties the two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the engine must not import: the harness, and the harness's plotting/table stack (an extra).
FORBIDDEN = {"analysis", "baselines", "experiments", "matplotlib", "pandas"}


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported_names(module: str, path: Path) -> list[tuple[str, int]]:
    """Every dotted name `module` imports (a `from a import b` gives a and a.b), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            out += [(name, node.lineno)] + [(f"{name}.{a.name}", node.lineno) for a in node.names]
    return out


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m, path in modules.items():
        for name, _ in _imported_names(m, path):
            parts = name.split(".")
            for i in range(len(parts), 0, -1):  # the longest prefix that is one of our modules
                target = ".".join(parts[:i])
                if target in modules:
                    if target != m:
                        graph[m].add(target)
                    break
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle_and_only_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_relax():
    cycles = _cycles(_graph(_modules("relax")))
    assert not cycles, "import cycles inside relax/:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_engine_imports_no_harness_and_no_plotting():
    bad = sorted({f"{path.relative_to(ROOT)}:{line}: imports {name.split('.')[0]}"
                  for m, path in _modules("relax").items() for name, line in _imported_names(m, path)
                  if name.split(".")[0] in FORBIDDEN})
    assert not bad, "relax/ must not import the harness or its plotting stack:\n" + "\n".join(bad)


def test_the_checks_read_the_whole_engine():
    # Guards the checks above against reading nothing (a moved folder would make them pass vacuously).
    modules = _modules("relax")
    assert len(modules) >= 50 and "relax.controller" in modules and "relax.bus.gate" in modules
