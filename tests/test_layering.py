"""The package's layering: no import cycle among tfswap modules (imports inside
functions included, since a function-level import only hides a cycle), and a
core that imports nothing outside ``tfswap.core``."""

import ast
from pathlib import Path

import tfswap

ROOT = Path(tfswap.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """tfswap modules ``name`` imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    # "import a.b.c" also runs a and a.b; a package's __init__ is not a cycle edge
    # of its own submodules, so only the named module counts.
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                got = visit(n)
                if got:
                    return got
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            got = visit(m)
            if got:
                return got
    return None


def test_no_import_cycle_among_tfswap_modules():
    graph = _graph()
    # The package's __init__ re-exports the public API; it is an entry point,
    # never imported by the modules it names.
    for deps in graph.values():
        deps.discard("tfswap")
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_core_imports_nothing_outside_the_core():
    graph = _graph()
    outside = {m: sorted(d for d in deps if not d.startswith("tfswap.core"))
               for m, deps in graph.items() if m.startswith("tfswap.core")}
    assert not any(outside.values()), {m: d for m, d in outside.items() if d}


def test_the_checker_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
