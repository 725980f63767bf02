"""What the key tests share: `manage.py keys` against a running server's database, and waiting until
the server has read a key made in that other process (it reads the keys again within a second)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

BOOT = "b00tstrap-key-for-tests"
FLEET = "fleet-key-for-tests"


def keys(server, *args: str) -> str:
    """`manage.py keys ARGS` on the server's OMLX_HOME; its stdout."""
    done = subprocess.run([sys.executable, "manage.py", "keys", *args], cwd=ROOT, env=server.env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def status(server, key: str, path: str = "/v1/models") -> int:
    return server.fetch("GET", path, headers=bearer(key), timeout=30).status_code


def made(server, *args: str) -> str:
    """A key made with `keys create ARGS`, once the server accepts it."""
    plain = keys(server, "create", *args)
    assert plain.startswith("omlx-") and "\n" not in plain
    server.wait_for(lambda: status(server, plain) == 200)
    return plain
