"""In-process fixtures for the dashboard: the real ASGI application over a fresh OMLX_HOME, its own
copy of the migrated database, and a runtime started anew for each test (each test has its own
event loop). Also Debian's Chromium for the browser tests, and the run's shared Redis (and
PostgreSQL) of tests/fleet/conftest.py for the fleet's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import connections

from tests.fleet.conftest import fleet_services, postgres, redis, redis_url  # noqa: F401 - fixtures, shared

SMALL = "tiny"          # a 20 MB fixture model, shared with the API tests
OTHER = "tiny-b"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make browser` (Debian's chromium package)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


def _use_database(path: str) -> None:
    connections.close_all()
    connections.settings["default"]["NAME"] = path


@pytest.fixture
async def site(tmp_path, migrated_db, make_model, monkeypatch):
    """The application of omlx_site.asgi over two small models; `site.ws(...)` makes communicators."""
    from pool import conf, runtime

    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    shutil.copy(migrated_db, home / "omlx.sqlite3")
    (home / "models" / SMALL).symlink_to(make_model("tiny-20", 20))
    (home / "models" / OTHER).symlink_to(make_model("tiny-20b", 20, seed=1))
    for name in ("OMLX_API_KEY", "OMLX_MAX_MODEL_MEMORY", "OMLX_MAX_LOADED_MODELS", "OMLX_IDLE_TTL", "OMLX_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMLX_HOME", str(home))
    monkeypatch.setenv("OMLX_MODEL_DIRS", str(home / "models"))
    monkeypatch.setenv("OMLX_MEMORY_CEILING", "off")
    conf.reload_settings()

    old_name = connections.settings["default"]["NAME"]
    _use_database(str(home / "omlx.sqlite3"))
    await sync_to_async(connections.close_all)()
    await runtime.reset_runtime()
    await get_channel_layer().flush()

    from omlx_site.asgi import application

    class Site:
        app = application
        home_dir = home

        @staticmethod
        def configure(**env) -> None:
            """Change OMLX_* settings before the first connection starts the runtime."""
            for key, value in env.items():
                monkeypatch.setenv(key, str(value))
            conf.reload_settings()

        @staticmethod
        def ws(*, origin="http://127.0.0.1:8000", host="127.0.0.1:8000", cookie=None, client="127.0.0.1"):
            headers = [(b"host", host.encode())]
            if origin:
                headers.append((b"origin", origin.encode()))
            if cookie:
                headers.append((b"cookie", cookie.encode()))
            communicator = WebsocketCommunicator(application, "/ws/pool/", headers=headers)
            communicator.scope["client"] = [client, 50123]   # Daphne sets the peer; the communicator does not
            return communicator

        @staticmethod
        def runtime():
            return runtime.get_runtime()

    yield Site
    await runtime.reset_runtime()
    await get_channel_layer().flush()
    await sync_to_async(connections.close_all)()
    _use_database(old_name)
    monkeypatch.undo()
    conf.reload_settings()
