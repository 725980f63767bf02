"""`manage.py serve` as the README documents it, on data folders no fixture prepared."""

import os
import sqlite3
import subprocess
import sys
import time

import httpx

from tests.conftest import DEMO, ROOT, Server, free_port


def _env(home, models=None, **extra) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OMLX_")}
    env = {**base, "OMLX_HOME": str(home), "PYTHONUNBUFFERED": "1", **extra}
    if models is not None:
        env["OMLX_MODEL_DIRS"] = str(models)
    return env


def _models_dir(tmp_path, demo_model_dir):
    models = tmp_path / "models"
    models.mkdir()
    (models / DEMO).symlink_to(demo_model_dir, target_is_directory=True)
    return models


def _home_with(migrated_db, tmp_path, sql: str):
    """A data folder holding a migrated database changed by `sql`."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "omlx.sqlite3").write_bytes(migrated_db.read_bytes())
    with sqlite3.connect(home / "omlx.sqlite3") as db:
        db.execute(sql)
    return home


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def _serve(env, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "serve", "--port", str(free_port())], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_serve_on_an_empty_home_migrates_and_pins_through_the_api(tmp_path, demo_model_dir):
    home = tmp_path / "new-home"   # does not exist yet: serve creates it
    env = _env(home, _models_dir(tmp_path, demo_model_dir))
    server = Server(tmp_path, free_port(), env).start()
    try:
        assert "applied" in server.log_text() and "migration" in server.log_text()
        r = server.post(f"/admin/model/{DEMO}/settings", {"is_pinned": True})
        assert r.status_code == 200, r.text
        assert server.model(DEMO)["pinned"] is True
    finally:
        assert server.stop() == 0
    with sqlite3.connect(home / "omlx.sqlite3") as db:
        assert db.execute("select is_pinned from pool_modelsettings where model_id = ?", (DEMO,)).fetchone() == (1,)

    # The second start finds the schema up to date: nothing applied, the pin still there.
    again = Server(tmp_path, free_port(), env)
    again.log_path = tmp_path / "second.log"
    again.start()
    try:
        assert "applied" not in again.log_text()
        assert again.model(DEMO)["pinned"] is True
    finally:
        again.stop()


def test_a_database_from_a_newer_version_stops_serve_with_one_line(tmp_path, migrated_db):
    home = _home_with(migrated_db, tmp_path, "insert into django_migrations (app, name, applied) "
                                             "values ('pool', '9999_future', '2030-01-01')")
    result = _serve(_env(home))
    assert result.returncode != 0
    line = _one_line(result.stderr)
    assert "pool.9999_future" in line and "newer" in line


def test_a_data_folder_that_cannot_be_created_stops_serve_with_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = _serve(_env(blocker / "home"))
    assert result.returncode != 0
    line = _one_line(result.stderr)
    assert "database" in line and str(blocker) in line


def test_health_is_503_with_the_reason_when_the_runtime_cannot_start(tmp_path, migrated_db):
    """Migrations recorded as applied but a table gone: serve listens, and says why it cannot serve."""
    env = _env(_home_with(migrated_db, tmp_path, "drop table pool_modelsettings"))
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        health = None
        deadline = time.monotonic() + 60
        while health is None and time.monotonic() < deadline:
            try:
                health = httpx.get(url + "/health", timeout=2)
            except httpx.HTTPError:
                time.sleep(0.2)
        assert health is not None and health.status_code == 503, health and health.text
        assert "no such table: pool_modelsettings" in health.json()["error"]["message"]
        assert health.json()["error"]["code"] == "server_not_ready"
        assert health.headers["Retry-After"]
        for _ in range(5):
            models = httpx.get(url + "/v1/models", timeout=5)
            assert models.status_code == 503 and models.json()["error"]["code"] == "server_not_ready"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    text = (tmp_path / "serve.log").read_text()
    # logged once, with its traceback, not once per request
    assert text.count("the server could not start") == 1, text[-3000:]
