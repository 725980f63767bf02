"""Text for API clients without this machine's file paths: an error a load raised names files by
absolute path (`/Users/me/.omlx-site/models/qwen/config.json`); a client sees them relative to the
models folder (`qwen/config.json`), and any other absolute path by its file name."""

from __future__ import annotations

import re

# an absolute path of at least two parts, not the tail of a word or a URL's host ("a/b", "x.com/y")
_ABSOLUTE = re.compile(r"(?<![\w.~:/-])(?:/[^\s'\"`/:,;()\[\]{}<>]+){2,}/?")


def without_paths(text: str, folders: dict[str, str]) -> str:
    """`text` with each folder of `folders` (absolute path -> what to show instead, such as the model's
    folder name) replaced, longest first, and every other absolute path cut to its last part."""
    for folder in sorted(folders, key=len, reverse=True):
        if folder:
            text = text.replace(folder.rstrip("/"), folders[folder])
    return _ABSOLUTE.sub(lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1], text)
