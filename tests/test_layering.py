"""STYLE.md's import directions, checked: routes and consumers never reach an engine, the enforcer
acts through the pool, and policy is pure."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imports(path: Path) -> set[str]:
    """Absolute module names a file imports (relative ones resolved against its package)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def files(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


@pytest.mark.parametrize("path", files("pool/api", "dashboard"), ids=lambda p: str(p.relative_to(ROOT)))
def test_routes_and_consumers_never_import_an_engine(path):
    assert not {m for m in imports(path) if m.startswith("pool.engines")}


@pytest.mark.parametrize("path", files("pool/policy"), ids=lambda p: str(p.relative_to(ROOT)))
def test_policy_imports_no_mlx_django_or_io(path):
    banned = ("mlx", "django", "asyncio", "pool.engine_pool", "pool.models", "pool.memory")
    assert not {m for m in imports(path) if m.startswith(banned)}


def test_the_enforcer_acts_only_through_the_pool():
    source = (ROOT / "pool/enforcer.py").read_text()
    assert ".entries" not in source and ".engine" not in source
    assert not {m for m in imports(ROOT / "pool/enforcer.py") if m.startswith("pool.engines")}


def test_the_core_imports_neither_routes_nor_the_dashboard():
    core = [p for p in files("pool") if "api" not in p.parts and "management" not in p.parts]
    for path in core:
        assert not {m for m in imports(path) if m.startswith(("pool.api", "dashboard"))}, path
