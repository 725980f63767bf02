"""The README documents every setting, with its default."""

from pathlib import Path

from pool.conf import SETTINGS

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_setting_is_documented_with_its_default():
    for setting in SETTINGS:
        line = next((l for l in README.splitlines() if l.startswith(f"| `{setting.name}`")), None)
        assert line is not None, f"{setting.name} is missing from the README"
        if setting.default:
            assert setting.default in line, f"{setting.name}'s default {setting.default!r} is not on its line"


def test_the_two_commands():
    assert "make run" in README and "make test" in README
