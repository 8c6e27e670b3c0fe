"""The layers the design pages draw: the server composes the domain packages, never the reverse, and the modules
that shared types were moved out of do not import each other in a circle. Read from the source (every import,
also those inside functions), so a lazy import does not hide a dependency."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "caldera"

BELOW_THE_SERVER = (
    "caldera.core",
    "caldera.images",
    "caldera.db",
    "caldera.errors",
    "caldera.runtime",
    "caldera.scheduler",
    "caldera.sim",
    "caldera.config",
)
NO_CIRCLE_THROUGH = (
    "caldera.config",
    "caldera.runtime.registry",
    "caldera.runtime.default",
    "caldera.errors",
    "caldera.db.membership",
    "caldera.images",
    "caldera.sim",
)
# the modules everything else stands on: they import no module of ours
FOUNDATIONS = ("caldera.config", "caldera.core")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "node_modules" not in p.parts}


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The caldera modules ``name`` imports (``from a import b`` counts b where b is a module of its own), inside
    functions too, but not in a module's ``__getattr__``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text(), str(path))
    for hook in [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]:
        tree.body.remove(hook)  # a package's lazy exports: importing one of its submodules never runs it
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])]
                )
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known)
    return {m for m in out if m == "caldera" or m.startswith("caldera.")}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: {m for m in _imports(name, path, known) if m in known} for name, path in known.items()}


def _in(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_domain_packages_never_import_the_server():
    known = _modules()
    found = [
        f"{name} imports {m}"
        for name, path in known.items()
        if _in(name, BELOW_THE_SERVER)
        for m in _imports(name, path, known)
        if _in(m, ("caldera.server",))
    ]
    assert not found, found


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), list(graph.get(start, ()))
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def test_no_import_circle_through_the_modules_that_were_untangled():
    graph = _graph()
    circles = [name for name in graph if _in(name, NO_CIRCLE_THROUGH) and name in _reaches(graph, name)]
    assert not circles, circles


def test_the_checks_see_a_dependency_and_a_circle():
    """The walk finds what it must: the server imports the images package, and a made-up circle is one."""
    graph = _graph()
    assert "caldera.images.catalogue" in _reaches(graph, "caldera.server.app")
    assert "caldera.runtime.container.probe" in graph["caldera.runtime.default"]  # a lazy import, in a function
    looped = {**graph, "caldera.config": graph["caldera.config"] | {"caldera.runtime.default"}}
    assert "caldera.config" in _reaches(looped, "caldera.config")


def test_the_settings_and_the_domain_import_nothing_above_them():
    """``caldera.config`` named the default runtime by importing the runtimes (lazily), so the settings and the
    runtime registry reached each other; the choice is now made above both (``caldera.runtime.default``)."""
    graph = _graph()
    found = [
        f"{name} imports {m}"
        for name in graph
        if _in(name, FOUNDATIONS)
        for m in graph[name]
        if not _in(m, FOUNDATIONS)
    ]
    assert not found, found


def test_kubernetes_is_imported_by_its_runtime_only():
    """The ``kubernetes`` client is the ``kubernetes`` extra, not a dependency: only its runtime may import it."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("kubernetes")]
    assert any(d.startswith("kubernetes") for d in project["optional-dependencies"]["kubernetes"])
    importers = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n == "kubernetes" or n.startswith("kubernetes.") for n in names):
                importers.append(name)
    assert importers and all(_in(m, ("caldera.runtime.kubernetes",)) for m in importers), importers
