"""Which model ids are usable, and the one file-system name each id gets.

An id is what clients write (a body's `model`, a path route's segment) and what discovery reads from
folder names, so it must be a name: not empty, no control characters, and no part (split on `/`, as
a Hugging Face id `Org/Name`) that is empty, `.` or `..`.

Every path derived from an id (a folder under $OMLX_HOME) goes through `safe_name`: a readable part
and a hash of the whole id, so two ids never share a name (`Org/Name` and a flat `Org--Name`, two ids
differing only in case on a case-insensitive disk) and no name leaves its parent (`..`, `.`, `/`)."""

from __future__ import annotations

import hashlib
import re
import unicodedata

MAX_ID_LENGTH = 512
_READABLE = re.compile(r"[^A-Za-z0-9._-]+")


def id_problem(model_id: str) -> str | None:
    """Why `model_id` is not a usable model id, or None when it is."""
    if not model_id:
        return "it is empty"
    if len(model_id) > MAX_ID_LENGTH:
        return f"it is longer than {MAX_ID_LENGTH} characters"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in model_id):
        return "it holds a control character"
    if model_id != model_id.strip():
        return "it starts or ends with a space"
    if any(part in ("", ".", "..") for part in model_id.split("/")):
        return "a part of it is empty, `.` or `..`"
    return None


def safe_name(model_id: str) -> str:
    """The file-system name for `model_id`: unique (a hash of the whole id) and a single plain
    component (never `.`, `..`, hidden, or holding a separator), whatever the id is."""
    digest = hashlib.sha256(model_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    readable = _READABLE.sub("_", model_id.replace("/", "--")).lstrip(".")[:80]
    return f"{readable}-{digest}" if readable else digest
