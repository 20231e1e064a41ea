"""The layer table of the design, checked on the code: who may import whom.

Every module of sluice belongs to one layer by where it lives; an import may only point
to its own layer or one the table lists below it. Daemon, client, agent and executor never
import each other (they meet as processes, through the wire). No module sits in an import
cycle, and none imports another module's private names. Imports that only serve type
checking (under ``if TYPE_CHECKING:``) are not imports at run time and are not counted.

``broker/__main__.py`` is the ``sluice`` command itself (``python -m broker``), the one
entry point that imports the cli: nothing imports it.
"""

from __future__ import annotations

import ast
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("landlock_helper", "broker", "executor", "agent")

# layer: (where, may import)
LAYERS = {
    "cli": ("broker.cli", {"web", "ray", "daemon", "client", "agent", "executor", "net", "wire", "sandbox"}),
    "web": ("broker.web", {"client", "net", "wire", "sandbox"}),
    # sluice on a Ray cluster: actors that run the daemon and executors as processes, and
    # the client library reaching them.
    "ray": ("broker.ray", {"client", "net", "wire", "sandbox"}),
    "daemon": ("broker.daemon", {"net", "wire", "sandbox"}),
    "client": ("broker.client", {"net", "wire", "sandbox"}),
    "agent": ("agent", {"net", "wire", "sandbox"}),
    "executor": ("executor", {"net", "wire", "sandbox"}),
    "net": ("broker.net", {"wire", "sandbox"}),
    "wire": ("broker.wire", {"sandbox"}),
    "sandbox": ("landlock_helper", set()),
    # broker/__init__.py: the package itself, above nothing.
    "broker": ("broker", {"net", "wire", "sandbox"}),
}
ENTRY_POINTS = {"broker.__main__": {"broker.cli.main"}}


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def layer_of(module: str) -> str:
    best = max((where for where, _ in LAYERS.values() if module == where or module.startswith(where + ".")),
               key=len)
    return next(layer for layer, (where, _) in LAYERS.items() if where == best)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node except what sits under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def imports(name: str, path: pathlib.Path, known: dict) -> tuple[set[str], list[str]]:
    """(modules of ours that ``name`` imports, private names it takes from other modules)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    private: list[str] = []
    aliases: dict[str, str] = {}
    tree = ast.parse(path.read_text(), str(path))
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    targets.add(alias.name)
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    targets.add(full)
                    aliases[alias.asname or alias.name] = full
                else:
                    targets.add(base)
                    if alias.name.startswith("_") and base != name:
                        private.append(f"{name} imports {alias.name} from {base}")
    for node in _runtime_nodes(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")
                and aliases[node.value.id] != name):
            private.append(f"{name} uses {aliases[node.value.id]}.{node.attr}")
    return {t for t in targets if t != name}, private


@functools.cache  # the sources do not change during a run; four tests read the graph
def graph() -> tuple[dict[str, frozenset[str]], tuple[str, ...]]:
    known = modules()
    edges, private = {}, []
    for name, path in known.items():
        targets, taken = imports(name, path, known)
        edges[name] = frozenset(t for t in targets if t in known)
        private.extend(taken)
    return edges, tuple(private)


def test_every_import_points_down_the_layer_table():
    edges, _ = graph()
    wrong = []
    for source, targets in sorted(edges.items()):
        allowed = LAYERS[layer_of(source)][1] | {layer_of(source)}
        for target in sorted(targets):
            if target in ENTRY_POINTS.get(source, ()):
                continue
            if layer_of(target) not in allowed:
                wrong.append(f"{source} ({layer_of(source)}) -> {target} ({layer_of(target)})")
    assert not wrong, "imports against the layer table:\n" + "\n".join(wrong)


def test_nothing_imports_the_cli_or_an_entry_point():
    edges, _ = graph()
    wrong = [f"{s} -> {t}" for s, ts in edges.items() for t in ts
             if (layer_of(t) == "cli" and layer_of(s) != "cli" and s not in ENTRY_POINTS)
             or (t.endswith("__main__") and layer_of(s) not in ("cli",) and s not in ENTRY_POINTS)]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles():
    edges, _ = graph()
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
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
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_module_takes_another_modules_private_names():
    _, private = graph()
    assert not private, "\n".join(sorted(private))


def test_the_checker_sees_a_wrong_way_import(tmp_path):
    """The scan itself works: an upward import, a cycle and a private name are found."""
    pkg = tmp_path / "broker" / "wire"
    pkg.mkdir(parents=True)
    (pkg / "frames.py").write_text("from broker.cli.main import _x\nimport broker.wire.other as o\no._y\n")
    (pkg / "other.py").write_text("if TYPE_CHECKING:\n    import broker.cli.main\nimport broker.wire.frames\n")
    known = {"broker.wire.frames": pkg / "frames.py", "broker.wire.other": pkg / "other.py",
             "broker.cli.main": pkg / "frames.py"}
    targets, private = imports("broker.wire.frames", pkg / "frames.py", known)
    assert targets == {"broker.cli.main", "broker.wire.other"}
    assert sorted(private) == ["broker.wire.frames imports _x from broker.cli.main",
                               "broker.wire.frames uses broker.wire.other._y"]
    targets, _ = imports("broker.wire.other", pkg / "other.py", known)
    assert targets == {"broker.wire.frames"}
    assert layer_of("broker.cli.main") == "cli" and layer_of("broker.wire.frames") == "wire"
    assert layer_of("broker") == "broker" and layer_of("agent.session") == "agent"


def test_the_source_root_holds_the_packages():
    """The processes sluice starts get this directory on PYTHONPATH: it must be the
    checkout's root (the modules moved deeper once, and the path pointed into broker/)."""
    from broker.net.runtime import SOURCE_ROOT, with_source_root

    assert pathlib.Path(SOURCE_ROOT) == ROOT
    for package in PACKAGES:
        assert (pathlib.Path(SOURCE_ROOT) / package / "__init__.py").exists()
    assert with_source_root({"PYTHONPATH": "/x"})["PYTHONPATH"] == f"{SOURCE_ROOT}:/x"
    assert with_source_root({})["PYTHONPATH"] == SOURCE_ROOT
