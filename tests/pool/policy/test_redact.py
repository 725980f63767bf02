"""Table for pool.policy.redact: load errors shown to clients name files without absolute paths."""

from __future__ import annotations

import pytest

from pool.policy.redact import without_paths

FOLDERS = {"/home/me/.omlx-site/models/qwen": "qwen", "/tmp/pytest-1/fixtures/tiny-20": "qwen"}


@pytest.mark.parametrize("text, expected", [
    ("FileNotFoundError: [Errno 2] No such file or directory: '/home/me/.omlx-site/models/qwen/config.json'",
     "FileNotFoundError: [Errno 2] No such file or directory: 'qwen/config.json'"),
    # the folder a symlink points at is the model's folder too
    ("Error: /tmp/pytest-1/fixtures/tiny-20/model.safetensors is truncated",
     "Error: qwen/model.safetensors is truncated"),
    # any other absolute path: its file name
    ("ValueError: cannot read /usr/lib/python3/site-packages/mlx/core.so (bad ELF)",
     "ValueError: cannot read core.so (bad ELF)"),
    ("no path here: 3/4 of a/b and https://example.com/x/y", "no path here: 3/4 of a/b and https://example.com/x/y"),
    ("root / alone and /single", "root / alone and /single"),
    ("", ""),
])
def test_without_paths(text, expected):
    assert without_paths(text, FOLDERS) == expected
