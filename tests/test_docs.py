"""The documentation stays true: every setting in its group's table with its default, no stale
setting names, links that resolve, `make` targets and `manage.py` commands that exist, a short
README, and the README's client snippet runs against a real server."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import get_commands

from pool.conf import SETTINGS, TESTING, TUNING, USER

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
BENCHMARKS = ROOT / "benchmarks" / "README.md"
ALL = [README, *DOCS, BENCHMARKS]
SECTIONS = {USER: "## Settings", TUNING: "## Tuning", TESTING: "## For tests"}

NAME = re.compile(r"OMLX_[A-Z_]+")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def settings_rows() -> dict[str, tuple[str, str]]:
    """name -> (the `## ` heading above its row, its default cell) in docs/configuration.md."""
    rows, heading = {}, None
    for line in (ROOT / "docs" / "configuration.md").read_text().splitlines():
        if line.startswith("## "):
            heading = line.strip()
        elif m := re.match(r"\| `(OMLX_[A-Z_]+)` \| ([^|]*) \|", line):
            assert m[1] not in rows, f"{m[1]} has two rows"
            rows[m[1]] = (heading, m[2].strip())
    return rows


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_every_setting_is_in_its_groups_table_with_its_default(setting):
    rows = settings_rows()
    assert setting.name in rows, f"{setting.name} has no row in docs/configuration.md"
    heading, default = rows[setting.name]
    assert heading == SECTIONS[setting.group], f"{setting.name} is under {heading!r}, not {SECTIONS[setting.group]!r}"
    assert default == (f"`{setting.default}`" if setting.default else "(empty)"), \
        f"{setting.name}'s default cell: {default}"


def test_no_stale_setting_names():
    real = {s.name for s in SETTINGS}
    bench_sources = "\n".join(p.read_text() for p in (ROOT / "benchmarks").rglob("*")
                              if p.is_file() and p != BENCHMARKS and p.suffix in (".py", ".sh"))
    for path in ALL:
        for name in set(NAME.findall(path.read_text())) - real:
            # benchmarks/README.md may name the settings the benchmark scripts themselves read
            assert path == BENCHMARKS and name in bench_sources, f"{rel(path)} names {name}, which is no setting"


def test_the_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines"


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors for a file's headings (fenced blocks left out)."""
    text = FENCE.sub("", path.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_relative_links_resolve(path):
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue   # http(s), mailto
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{rel(path)} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in heading_anchors(linked), f"{rel(path)} links to {target}: no such heading"


def code(path: Path) -> str:
    """The fenced blocks and inline code spans of a markdown file."""
    text = path.read_text()
    return "\n".join(FENCE.findall(text) + re.findall(r"`([^`\n]+)`", FENCE.sub("", text)))


def test_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w-]*):(?!=)", makefile, re.M))
    for path in ALL:
        for target in re.findall(r"(?<![\w/.-])make ([a-z][\w-]*\*?)", code(path)):
            known = any(t.startswith(target[:-1]) for t in targets) if target.endswith("*") else target in targets
            assert known, f"{rel(path)} runs `make {target}`, which the Makefile does not define"


def test_manage_commands_exist():
    commands = set(get_commands())
    for path in ALL:
        for command in re.findall(r"manage\.py ([a-z_]+)", path.read_text()):
            assert command in commands, f"{rel(path)} runs `manage.py {command}`, which is no command"


def test_the_readmes_snippet_runs(start_server, tmp_path):
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)
    assert len(blocks) == 1, "README.md should hold one python block"
    assert "http://127.0.0.1:8000" in blocks[0]
    server = start_server()
    script = tmp_path / "snippet.py"
    script.write_text(blocks[0].replace("http://127.0.0.1:8000", server.url))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the snippet printed no answer"


def test_every_file_and_module_the_architecture_names_exists():
    """docs/architecture.md names files (in its tree and in text) and modules: each must exist, so the
    page follows the code when a module moves."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    names = set(re.findall(r"\b([a-z_]+\.py)\b", text))
    existing = {p.name for folder in ("pool", "dashboard", "omlx_site", "tests", "benchmarks")
                for p in (ROOT / folder).rglob("*.py")} | {"manage.py"}
    assert names - existing == set()
    for module in set(re.findall(r"`((?:pool|omlx_site|dashboard)(?:\.[a-z_]+)+)", text)):
        path = ROOT / module.replace(".", "/")
        parts = module.split(".")
        assert (path.with_suffix(".py").exists() or path.is_dir()
                or (ROOT / "/".join(parts[:-1])).with_suffix(".py").exists()), module
    for folder in set(re.findall(r"^\s+([a-z_]+)/\s", text, re.M)):
        assert any(p.is_dir() for p in ROOT.rglob(folder) if ".venv" not in p.parts), folder
