"""The layout of ``service/`` as the Architecture section of ``service/__init__.py`` states it:
import-linter's contracts (``pyproject.toml``) hold, no import cycle between modules, and each
folder imports only what it may.

Every ``import`` / ``from ... import`` of a module counts, wherever it stands (top level,
``TYPE_CHECKING`` blocks, inside functions): a cycle hidden in a function is still a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "service"

#: What each part may import from ``service`` (by module prefix); anything else is a violation.
ALLOWED: dict[str, tuple[str, ...]] = {
    "service.core": ("service.core",),
    "service.errors": (),
    "service.config": (),
    "service.security": (),
    "service.logs": (),
    "service.allocator": (),
    "service.telemetry": ("service.core",),
    "service.storage": ("service.core", "service.errors", "service.storage"),
    "service.engine": (
        "service.core",
        "service.storage",
        "service.errors",
        "service.config",
        "service.telemetry",
        "service.engine",
    ),
    "service.api": (
        "service.core",
        "service.errors",
        "service.config",
        "service.security",
        "service.telemetry",
        "service.engine",
        "service.api",
    ),
}
#: Third-party packages a part must not import (the core is pure; the engine knows no HTTP and
#: no Redis client; the API no Redis client: failures of Redis reach both as domain errors).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "service.core": ("fastapi", "starlette", "uvicorn", "redis", "asyncio", "pydantic", "httpx"),
    "service.errors": ("fastapi", "starlette", "redis", "pydantic"),
    "service.storage": ("fastapi", "starlette", "uvicorn", "pydantic", "httpx"),
    "service.engine": ("fastapi", "starlette", "uvicorn", "pydantic", "httpx", "redis", "hiredis"),
    "service.api": ("redis", "hiredis"),
    "service.telemetry": ("fastapi", "starlette"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, name: str, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(modules of ``service`` imported by the file, top-level third-party packages)."""
    inner: set[str] = set()
    outer: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # ``from a.b import c`` imports the module a.b.c when c is one, else a.b
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        for target in targets:
            if target == "service" or target.startswith("service."):
                while target not in modules:
                    target = target.rpartition(".")[0]
                inner.add(target)
            else:
                outer.add(target.split(".")[0])
    inner.discard(name)
    return inner, outer


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules)[0] for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_service() -> None:
    graph = _graph()
    assert len(graph) > 30
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def _part(name: str) -> str | None:
    for part in sorted(ALLOWED, key=len, reverse=True):
        if name == part or name.startswith(part + "."):
            return part
    return None


@pytest.mark.parametrize("name", sorted(_modules()))
def test_each_module_imports_only_what_its_folder_may(name: str) -> None:
    part = _part(name)
    if part is None:  # service.app, service.__main__: the composition root
        return
    modules = _modules()
    inner, outer = _imports(modules[name], name, modules)
    wrong = sorted(m for m in inner if not m.startswith(ALLOWED[part]))
    assert not wrong, f"{name} ({part}) may not import {wrong}"
    banned = sorted(outer & set(FORBIDDEN.get(part, ())))
    assert not banned, f"{name} ({part}) may not import {banned}"


def test_the_import_linter_contracts_hold() -> None:
    """``lint-imports`` (import-linter, configured in ``pyproject.toml``) passes; its report is
    the failure message."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 kept, 0 broken" in done.stdout, done.stdout
