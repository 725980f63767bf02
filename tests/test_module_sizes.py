"""Small modules: when one grows past 400 lines, it is two things (the house style)."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 400
MODULES = sorted(p for folder in ("pool", "dashboard", "omlx_site", "benchmarks", "tests")
                 for p in (ROOT / folder).rglob("*.py") if "migrations" not in p.parts)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_over_400_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= LIMIT, f"{path.relative_to(ROOT)} has {lines} lines"
