"""STYLE.md's import directions, checked: routes and consumers never reach an engine, the enforcer
acts through the pool, and policy is pure."""

import ast
import sys
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



def test_the_pool_never_imports_the_site():
    """omlx_site -> pool, never back: only `serve`, which runs the site, names it."""
    for path in files("pool"):
        if path != ROOT / "pool/management/commands/serve.py":
            assert not {m for m in imports(path) if m.startswith("omlx_site")}, path

# Records what a process loads through ctypes (a library, a symbol looked up in it) and reports, as
# JSON, whether MLX was imported, the BLAS state and the libraries mapped. Run before anything else.
SPY = """
import ctypes, json, os, sys
seen = []

class Spy(ctypes.CDLL):
    def __init__(self, name, *args, **kwargs):
        seen.append(["load", str(name)])
        super().__init__(name, *args, **kwargs)

    def __getattr__(self, name):
        if not name.startswith("__"):
            seen.append(["symbol", name])
        return super().__getattr__(name)

ctypes.CDLL = Spy

def report(stage):
    blas = sys.modules.get("omlx_site.blas")
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    print(json.dumps({"stage": stage, "mlx": "mlx.core" in sys.modules, "ctypes": list(seen),
                      "blas_state": blas.state if blas else None,
                      "blas_mapped": any(n in maps for n in ("libopenblas", "libmkl_rt")),
                      "env": os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS")}))
"""


def _spied(code: str) -> list[dict]:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMLX_BLAS", "TRANSFORMERS_NO_ADVISORY_WARNINGS")}
    done = subprocess.run([sys.executable, "-c", SPY + code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_importing_the_pool_sets_nothing_up_in_the_process():
    """No BLAS preload, no mallopt, no environment change and no MLX from importing the core: the
    entry points call omlx_site.process.setup_process() first (pool.runtime imports MLX today, through
    pool.serving's engine imports; it still sets nothing up)."""
    first, runtime = _spied("import pool, pool.engine_pool\nreport('pool')\nimport pool.runtime\nreport('runtime')")
    assert first["mlx"] is False and first["env"] is None      # (mlx_lm sets the variable itself)
    for stage in (first, runtime):
        assert stage["blas_state"] is None and not stage["blas_mapped"], stage
        assert ["symbol", "mallopt"] not in stage["ctypes"], stage
        assert not [name for kind, name in stage["ctypes"] if kind == "load" and "blas" in name.lower()], stage


def test_setup_process_preloads_the_blas_and_tunes_malloc_once():
    from pool.backend import cpu_backend

    (stage, again) = _spied("from omlx_site.process import setup_process\nsetup_process()\nreport('setup')\n"
                            "setup_process()\nreport('again')")
    assert stage["blas_state"] is not None and stage["mlx"] is False and stage["env"] == "1"
    assert again["ctypes"] == stage["ctypes"]            # a second call does nothing
    if sys.platform.startswith("linux"):
        assert stage["ctypes"].count(["symbol", "mallopt"]) == 1
    if cpu_backend() and stage["blas_state"]["path"]:
        assert stage["blas_mapped"]
