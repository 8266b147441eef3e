"""The layout of the package: one seam, backends of the same shape, no cycles."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from agentstate.backends import base
from agentstate.backends.local import LocalOps
from agentstate.backends.remote import RemoteOps

PACKAGE = Path(__file__).resolve().parent.parent / "agentstate"
REPOS = {"kv": base.KVRepo, "runs": base.RunsRepo, "sessions": base.SessionsRepo,
         "feed": base.FeedRepo, "tokens": base.TokensRepo, "admin": base.AdminRepo,
         "history": base.HistoryRepo}
MAX_LINES = 650  # "about 600"


def _members(proto: type) -> dict[str, inspect.Signature]:
    """The methods a Protocol declares, with their signatures (self left out)."""
    out = {}
    for name, fn in vars(proto).items():
        if name.startswith("_") or not callable(fn) and not isinstance(fn, property):
            continue
        if isinstance(fn, property):
            out[name] = None
            continue
        sig = inspect.signature(fn)
        out[name] = sig.replace(parameters=list(sig.parameters.values())[1:])
    return out


def _params(sig: inspect.Signature | None) -> list[tuple[str, object]]:
    if sig is None:
        return []
    return [(p.name, p.kind) for p in sig.parameters.values()]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("repo", sorted(REPOS))
def test_each_backend_supplies_every_repository_function(backend, repo):
    """Both backends' repository modules have every function the interface in base.py
    names, with the same parameters in the same order."""
    import importlib

    module = importlib.import_module(f"agentstate.backends.{backend}.{repo}")
    for name, sig in _members(REPOS[repo]).items():
        fn = getattr(module, name, None)
        assert callable(fn), f"{backend}.{repo} has no {name}()"
        assert [p for p, _ in _params(inspect.signature(fn))] == [p for p, _ in _params(sig)], (
            f"{backend}.{repo}.{name}{inspect.signature(fn)} differs from base {name}{sig}")


@pytest.mark.parametrize("ops", [LocalOps, RemoteOps])
def test_local_and_remote_operations_implement_the_seam(ops):
    """LocalOps and RemoteOps implement every operation of base.Ops with its parameters,
    and offer no public operation the seam does not name."""
    seam = _members(base.Ops)
    for name, sig in seam.items():
        member = inspect.getattr_static(ops, name, None)
        assert member is not None, f"{ops.__name__} lacks {name}"
        if sig is None:
            assert isinstance(member, property), f"{ops.__name__}.{name} is not a property"
            continue
        got = inspect.signature(getattr(ops, name))
        assert _params(got)[1:] == _params(sig), f"{ops.__name__}.{name}{got} vs Ops.{name}{sig}"
    extra = {n for n in vars(ops) if not n.startswith("_") and callable(getattr(ops, n))
             and n not in seam}
    assert extra == set(), f"{ops.__name__} has operations outside the seam: {extra}"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _runtime_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports when it runs (TYPE_CHECKING blocks aside)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base_mod = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[:len(parent) - node.level + 1]
                base_mod = ".".join(parent + ([node.module] if node.module else []))
            for a in node.names:
                if f"{base_mod}.{a.name}" in known:
                    found.add(f"{base_mod}.{a.name}")
                elif base_mod in known:
                    found.add(base_mod)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(name)
    return found


def test_no_import_cycle_at_run_time():
    """No two modules of the package import each other, directly or around a loop
    (a package's __init__ importing its own submodules aside)."""
    mods = _modules()
    graph = {m: _runtime_imports(m, p, set(mods)) for m, p in mods.items()}
    # A package imports its submodules; a submodule importing a sibling through the
    # package is not a cycle in practice: leave the package -> own submodule edges out.
    for m in graph:
        graph[m] = {d for d in graph[m] if not d.startswith(m + ".")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    assert cycles == []


def test_no_module_is_overlong():
    """Every module stays under about 600 lines."""
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
