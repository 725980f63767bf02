"""docs/architecture.md's arrows that must never be, checked on what the code imports (the module
names in its import statements, resolved) and, for the routes, on what a process has loaded after
importing them."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imports(path: Path) -> set[str]:
    """Absolute module names a file imports (relative ones resolved against its package), with the
    names it takes from each (`from a import b` gives `a` and `a.b`)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    if path.name == "__init__.py":
        package = ".".join(path.relative_to(ROOT).parts[:-1])
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
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py")) if "migrations" not in p.parts]


def module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def crossing(path: Path, banned: tuple[str, ...], allowed: tuple[str, ...] = ()) -> set[str]:
    return {m for m in imports(path) if m.startswith(banned) and not m.startswith(allowed)}


# (the files, what they must never import, exceptions): one row per arrow docs/architecture.md forbids
RULES = [
    ("pool/policy", ("mlx", "numpy", "django", "asyncio", "psutil", "pool."), ("pool.policy",)),
    ("pool/engines", ("django", "channels", "pool.api", "pool.host", "pool.serving", "pool.router", "pool.runtime",
                      "pool.models", "pool.services", "dashboard", "omlx_site"), ()),
    ("pool/api", ("mlx", "numpy", "pool.engines", "pool.host", "dashboard", "omlx_site"), ("pool.host.protocol",)),
    ("dashboard", ("mlx", "pool.engines", "pool.host", "pool.serving", "omlx_site"), ()),
    ("pool/serving", ("pool.api", "pool.router", "pool.runtime", "dashboard", "django"), ()),
    ("pool/host", ("pool.api", "pool.router", "pool.runtime", "dashboard", "django"), ()),
    ("pool/tools", ("pool.api", "pool.host", "pool.serving", "pool.engines", "django"), ()),
    ("pool/router.py", ("pool.api", "pool.engines", "dashboard", "django"), ()),
    ("pool/catalog/kinds.py", ("mlx", "pool.engines", "django"), ()),
    ("pool/errors.py", ("django", "pool.api"), ()),
    ("pool/fleet", ("mlx", "numpy", "pool.api", "pool.engines", "pool.host", "pool.serving", "dashboard", "omlx_site"),
     ()),
    ("pool/fleet/placement.py", ("django", "asyncio", "httpx", "redis", "channels", "pool.runtime"), ()),
    ("pool/fleet/pins.py", ("django", "asyncio", "httpx", "redis", "channels", "pool.runtime"), ()),
]


@pytest.mark.parametrize("folder, banned, allowed", RULES, ids=[r[0] for r in RULES])
def test_nothing_crosses_a_forbidden_arrow(folder, banned, allowed):
    paths = [ROOT / folder] if folder.endswith(".py") else files(folder)
    crossings = {module(p): sorted(crossing(p, banned, allowed)) for p in paths}
    assert not {m: c for m, c in crossings.items() if c}


def test_the_core_imports_neither_routes_nor_the_dashboard_nor_the_site():
    core = [p for p in files("pool") if "api" not in p.parts and "management" not in p.parts]
    bad = {module(p): sorted(crossing(p, ("pool.api", "dashboard", "omlx_site"))) for p in core}
    assert not {m: c for m, c in bad.items() if c}


def test_only_the_local_host_wires_the_serving_door():
    """The host's parts (pool, enforcer, gate) know nothing of the door above them; local.py builds both."""
    users = {module(p) for p in files("pool/host") if crossing(p, ("pool.serving",))}
    assert users == {"pool.host.local"}


def test_the_enforcer_acts_only_through_the_pressure_verbs():
    path = ROOT / "pool/host/enforcer.py"
    tree = ast.parse(path.read_text())
    touched = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not touched & {"entries", "engine", "unload_entry"}
    assert not crossing(path, ("pool.engines",))


def test_engines_read_no_settings():
    """The pool decides (LoadOptions, PromptCacheOptions); an engine obeys."""
    bad = {module(p) for p in files("pool/engines") if crossing(p, ("pool.conf", "pool.memory"))}
    assert not bad


def test_importing_the_routes_loads_no_mlx_and_no_engine():
    """Not only the import statements: what a process holds after importing every route."""
    code = ("import os, sys, json; os.environ['DJANGO_SETTINGS_MODULE'] = 'omlx_site.settings'\n"
            "import django; django.setup()\nimport pool.api.urls, dashboard.routing, dashboard.views\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'transformers')"
            " or m.startswith(('pool.engines', 'pool.host.engine_pool', 'pool.serving.completion')))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


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
    entry points call omlx_site.process.setup_process() first."""
    first, runtime = _spied("import pool, pool.host.engine_pool\nreport('pool')\n"
                            "import pool.runtime\nreport('runtime')")
    assert first["mlx"] is False and first["env"] is None      # (mlx_lm sets the variable itself)
    assert runtime["mlx"] is False
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
