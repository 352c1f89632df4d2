"""The product's layout holds: no import cycle in `conveyor/`, the engine and the api each keep to
their side of the boundaries, every Lua script lives in conveyor/jobqueue/scripts/ with a legend that
matches it, and the wheel installs the single package `conveyor`.

The import graph is read from the sources (AST), never by importing them: every absolute import of
a `conveyor` module counts, also those inside a function or under TYPE_CHECKING — a cycle there is
still two modules that cannot be read, or moved, one without the other.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.jobqueue.scripts import Script, batches, jobs, worker

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "conveyor"

# pure: the engine's prefix cache hashes blocks as the api's placement does
ENGINE_MAY_IMPORT = frozenset({"conveyor.jobqueue.prefix_hash"})
ENGINE_FORBIDDEN = ("redis", "fastapi", "starlette", "httpx", "conveyor.api", "conveyor.worker",
                    "conveyor.jobqueue")
API_FORBIDDEN = ("torch", "conveyor.engine")
JOBQUEUE_FORBIDDEN = ("conveyor.api", "conveyor.worker")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_names(path: Path) -> Iterator[str]:
    """Every absolute import of a module, anywhere in it: `a.b` for `import a.b`, `a.b.c` for
    `from a.b import c` (c may be a module or a name in a.b)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def owning_module(name: str) -> str | None:
    """The `conveyor` module a dotted name is, or lives in (the nearest module above it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


IMPORTS = {module: set(imported_names(path)) for module, path in MODULES.items()}


def internal_edges(module: str) -> set[str]:
    """The `conveyor` modules that `module` imports."""
    owners = {owning_module(name) for name in IMPORTS[module] if name.startswith("conveyor.")}
    return {owner for owner in owners if owner is not None and owner != module}


GRAPH = {module: internal_edges(module) for module in MODULES}


def a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the path a → b → ... → a; None when the graph has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles until none is left, each found after cutting the edge that closed the one before,
    so that every tangle shows (not only the first)."""
    graph = {node: set(edges) for node, edges in graph.items()}
    found = []
    while (cycle := a_cycle(graph)) is not None:
        found.append(cycle)
        graph[cycle[-2]].discard(cycle[-1])
    return found


def test_the_cycle_finder_finds_every_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}}) == [
        ["a", "b", "c", "a"], ["d", "e", "d"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_product_has_no_import_cycle() -> None:
    found = cycles(GRAPH)
    assert found == [], "import cycles:\n" + "\n".join(" → ".join(cycle) for cycle in found)


@functools.cache
def reachable(start: str) -> frozenset[str]:
    """The `conveyor` modules importing `start` runs: its imports, theirs, and each one's packages."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parent = module.rpartition(".")[0]
        todo.extend(GRAPH[module] | ({parent} if parent else set()))
    return frozenset(seen)


def offences(roots: str, forbidden: tuple[str, ...], allowed: frozenset[str] = frozenset()) -> list[str]:
    """`importer imports name` for each forbidden import reached from the modules under `roots`."""
    def banned(name: str) -> bool:
        return name not in allowed and any(name == f or name.startswith(f + ".") for f in forbidden)

    found = set()
    for root in (m for m in MODULES if m == roots or m.startswith(roots + ".")):
        for module in reachable(root) - allowed:
            names = {n for n in IMPORTS[module] if not n.startswith("conveyor.")} | GRAPH[module]
            found.update(f"{root}: {module} imports {name}" for name in names if banned(name))
    return sorted(found)


def test_the_engine_imports_no_redis_http_or_service_code() -> None:
    assert offences("conveyor.engine", ENGINE_FORBIDDEN, ENGINE_MAY_IMPORT) == []


def test_the_api_imports_no_torch_and_no_engine() -> None:
    assert offences("conveyor.api", API_FORBIDDEN) == []


def test_the_redis_protocol_imports_no_api_and_no_worker() -> None:
    assert offences("conveyor.jobqueue", JOBQUEUE_FORBIDDEN) == []


def test_the_boundary_check_sees_a_transitive_import() -> None:
    """The api reaches conveyor.jobqueue.keys through its own modules: forbidding it must show."""
    found = offences("conveyor.api", ("conveyor.jobqueue.keys",))
    assert "conveyor.api.app: conveyor.api.jobpath.admission imports conveyor.jobqueue.keys" in found


SCRIPTS = {
    **{f"worker.{name}": script for name, script in worker.worker_scripts().items()},
    **{f"jobs.{name}": value for name, value in vars(jobs).items() if isinstance(value, Script)},
    **{f"batches.{name}": value for name, value in vars(batches).items() if isinstance(value, Script)},
}


def test_every_lua_script_lives_in_jobqueue_scripts() -> None:
    scripts_dir = PACKAGE / "jobqueue" / "scripts"
    outside = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
               if scripts_dir not in p.parents and "redis.call(" in p.read_text()]
    assert outside == []


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_scripts_legend_names_what_it_uses(name: str) -> None:
    """KEYS[i] and ARGV[i] used in the source are those the legend names, every fixed one of them; a
    legend whose last entry ends in `...` takes the rest too."""
    script = SCRIPTS[name]
    for table, legend in (("KEYS", script.keys), ("ARGV", script.argv)):
        used = {int(i) for i in re.findall(rf"\b{table}\[(\d+)\]", script.source)}
        variadic = bool(legend) and legend[-1].endswith("...")
        fixed = len(legend) - variadic
        assert used <= set(range(1, len(legend) + 1)), f"{name}: {table} {sorted(used)} vs legend {legend}"
        assert set(range(1, fixed + 1)) <= used, f"{name}: legend {legend} names {table} it does not use"
        if variadic:
            assert f"#{table}" in script.source or "unpack(" in script.source, f"{name}: {legend[-1]}"


@pytest.mark.slow
def test_the_wheel_installs_only_conveyor(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a clean copy: a build/ left in the checkout could add stale modules
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / "conveyor", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(source)], check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["conveyor"]
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"conveyor"}
