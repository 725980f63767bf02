"""Hosts of a fleet on one PostgreSQL (OMLX_DATABASE_URL): the schema, the settings' write path and
the eviction history, through real `manage.py migrate` and `manage.py serve` processes."""

import os
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import DEMO, ROOT, Server, free_port, serve
from tests.fleet.services import Postgres


@pytest.fixture
def fleet_server(tmp_path, migrated_db, demo_model_dir):
    """fleet_server(url, host_id, **env) -> a running Server with its own OMLX_HOME (its SQLite file
    is there but unused) on the database at `url`, serving the demo model. Each must stop with 0."""
    servers: list[Server] = []

    def start(url: str, host_id: str, **env) -> Server:
        server = serve(tmp_path / f"{host_id}-{len(servers)}", migrated_db, {DEMO: demo_model_dir},
                       OMLX_DATABASE_URL=url, OMLX_HOST_ID=host_id, **env)
        servers.append(server)
        return server

    yield start
    codes = [(server.stop(), server) for server in servers]
    for code, server in codes:
        assert code == 0, server.log_text()[-3000:]


def _manage(home, url: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMLX_")}
    env.update(OMLX_HOME=str(home), OMLX_DATABASE_URL=url, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _applied(postgres, url: str) -> set[str]:
    return {name for (name,) in postgres.query(url, "SELECT name FROM django_migrations WHERE app = 'pool'")}


def _columns(postgres, url: str, table: str) -> set[str]:
    rows = postgres.query(url, "SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,))
    return {name for (name,) in rows}


# ---- the schema ---------------------------------------------------------------------------------

def test_manage_py_migrate_creates_the_schema_on_postgresql(tmp_path, postgres, pg_url):
    assert not postgres.query(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    done = _manage(tmp_path / "home", pg_url, "migrate", "--noinput")
    assert done.returncode == 0, done.stdout + done.stderr
    assert {"0001_initial", "0005_event_host"} <= _applied(postgres, pg_url)
    assert {"host", "model_id", "reason"} <= _columns(postgres, pg_url, "pool_evictionevent")
    assert {"alias", "ttl_seconds", "is_pinned"} <= _columns(postgres, pg_url, "pool_modelsettings")
    assert not (tmp_path / "home" / "omlx.sqlite3").exists(), "the SQLite file was written instead"

    again = _manage(tmp_path / "home", pg_url, "migrate", "--noinput")
    assert again.returncode == 0 and "No migrations to apply" in again.stdout, again.stdout + again.stderr


def test_two_servers_started_at_once_on_an_empty_database_both_come_up(pg_url, postgres, fleet_server):
    assert not postgres.query(pg_url, "SELECT 1 FROM pg_tables WHERE tablename = 'django_migrations'")
    with ThreadPoolExecutor(2) as starting:
        alpha, beta = starting.map(lambda host: fleet_server(pg_url, host), ["alpha", "beta"])
    assert alpha.get("/health").status_code == 200 and beta.get("/health").status_code == 200
    assert DEMO in alpha.states() and DEMO in beta.states()
    # serve migrated the empty database itself, and one of them did it: the other waited on the lock
    migrated = [s for s in (alpha, beta) if "applied" in s.log_text()]
    assert len(migrated) == 1, [s.log_text()[-2000:] for s in (alpha, beta)]
    assert "0005_event_host" in _applied(postgres, pg_url)


# ---- the settings' write path -------------------------------------------------------------------

def test_a_settings_write_on_one_host_is_read_by_another(pg_url, postgres, fleet_server):
    alpha = fleet_server(pg_url, "alpha")
    beta = fleet_server(pg_url, "beta")
    assert beta.model(DEMO)["alias"] is None

    r = alpha.post(f"/admin/model/{DEMO}/settings", {"ttl_seconds": 30, "alias": "x"})
    assert r.status_code == 200, r.text
    assert r.json()["alias"] == "x" and r.json()["ttl_seconds"] == 30
    assert postgres.query(pg_url, "SELECT alias, ttl_seconds FROM pool_modelsettings WHERE model_id = %s",
                          (DEMO,)) == [("x", 30)]
    assert alpha.model(DEMO)["alias"] == "x"
    r = alpha.post(f"/admin/model/{DEMO}/settings", {"notes": "a\u0000b"})   # PostgreSQL's text cannot hold it
    assert r.status_code == 400 and r.json()["error"]["param"] == "notes", r.text

    assert beta.stop() == 0
    beta.start()
    model = beta.model(DEMO)
    assert (model["alias"], model["ttl_seconds"]) == ("x", 30), model
    by_alias = beta.get("/admin/model/x/settings")
    assert by_alias.status_code == 200 and by_alias.json()["model_id"] == DEMO, by_alias.text


def test_writes_from_two_hosts_at_once_all_land(pg_url, postgres, fleet_server):
    """No lost update and no 500 when two hosts write the same model's settings at once, its row
    not there yet at first (SQLite's writers take turns; PostgreSQL's run side by side)."""
    alpha, beta = fleet_server(pg_url, "alpha"), fleet_server(pg_url, "beta")
    path = f"/admin/model/{DEMO}/settings"
    with ThreadPoolExecutor(8) as writers:
        for n in range(1, 6):
            bodies = [(alpha, {"max_tokens": n}), (beta, {"temperature": n / 10}),
                      (alpha, {"notes": f"round {n}"}), (beta, {"display_name": f"round {n}"})]
            answers = list(writers.map(lambda sb: sb[0].post(path, sb[1]), bodies))
            assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
            row = postgres.query(pg_url, "SELECT max_tokens, temperature, notes, display_name FROM pool_modelsettings")
            assert row == [(n, n / 10, f"round {n}", f"round {n}")], n


def test_a_write_acknowledged_before_kill_9_is_there_after_the_restart(pg_url, postgres, fleet_server):
    server = fleet_server(pg_url, "alpha")
    r = server.post(f"/admin/model/{DEMO}/settings", {"notes": "written before the kill", "max_tokens": 77})
    assert r.status_code == 200, r.text
    server.proc.send_signal(signal.SIGKILL)
    assert server.proc.wait(30) == -signal.SIGKILL

    assert postgres.query(pg_url, "SELECT notes, max_tokens FROM pool_modelsettings WHERE model_id = %s",
                          (DEMO,)) == [("written before the kill", 77)]
    first_run = len(server.log_text())
    server.start()
    values = server.get(f"/admin/model/{DEMO}/settings").json()
    assert (values["notes"], values["max_tokens"]) == ("written before the kill", 77), values
    assert "applied" not in server.log_text()[first_run:]   # the schema was already there


# ---- the eviction history -----------------------------------------------------------------------

def test_eviction_history_rows_name_their_host(pg_url, postgres, fleet_server):
    alpha = fleet_server(pg_url, "alpha")
    assert alpha.post(f"/api/models/{DEMO}/load", {}).status_code == 200
    assert alpha.post(f"/api/models/{DEMO}/unload", {}).status_code == 200

    event = alpha.wait_for(lambda: next((e for e in alpha.events() if e.get("stored", True)), None), timeout=20)
    assert (event["host"], event["model"], event["reason"]) == ("alpha", DEMO, "manual"), event
    rows = postgres.query(pg_url, "SELECT id, host, model_id, reason FROM pool_evictionevent")
    assert rows == [(event["id"], "alpha", DEMO, "manual")]

    beta = fleet_server(pg_url, "beta")
    [seen] = beta.events()
    assert (seen["id"], seen["host"], seen["model"]) == (event["id"], "alpha", DEMO), seen
    assert [e["host"] for e in beta.events(model=DEMO)] == ["alpha"]


# ---- a database that goes away and comes back ----------------------------------------------------

@pytest.fixture
def own_postgres():
    """A PostgreSQL of this test's own: an outage the run's shared one must not have."""
    pg = Postgres.start()
    yield pg
    pg.stop()


def test_a_database_outage_refuses_settings_writes_and_keeps_the_history_until_it_is_back(own_postgres,
                                                                                          fleet_server):
    url = own_postgres.new_database("outage")
    server = fleet_server(url, "alpha")
    own_postgres.pause()

    r = server.post(f"/admin/model/{DEMO}/settings", {"alias": "during"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "storage_error", r.text
    assert "Retry-After" in r.headers
    assert server.model(DEMO)["alias"] is None   # nothing applied that a restart would not find
    assert server.post(f"/api/models/{DEMO}/load", {}).status_code == 200
    assert server.post(f"/api/models/{DEMO}/unload", {}).status_code == 200   # its row waits in memory

    own_postgres.resume()
    rows = server.wait_for(lambda: own_postgres.query(url, "SELECT host, model_id, reason FROM pool_evictionevent "
                                                           "WHERE action = 'unload'"), timeout=30)
    assert rows == [("alpha", DEMO, "manual")]
    r = server.post(f"/admin/model/{DEMO}/settings", {"alias": "after"})
    assert r.status_code == 200, r.text
    assert server.model(DEMO)["alias"] == "after"
    assert [e["host"] for e in server.events(model=DEMO) if e["action"] == "unload"] == ["alpha"]


# ---- a database that is not there ---------------------------------------------------------------

def test_an_unreachable_database_stops_serve_with_one_line(tmp_path):
    url = f"postgres://omlx:not-this-password@127.0.0.1:{free_port()}/nowhere"   # nothing listens there
    home = tmp_path / "home"
    done = _manage(home, url, "serve", "--port", str(free_port()), timeout=60)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "database" in lines[0] and "nowhere" in lines[0], lines[0]
    assert "not-this-password" not in done.stdout + done.stderr


def test_a_database_that_never_answers_stops_serve_with_one_line(tmp_path):
    with socket.socket() as silent:   # the kernel completes the connection; nobody ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"postgres://omlx:pw@127.0.0.1:{silent.getsockname()[1]}/silent"
        done = _manage(tmp_path / "home", url, "serve", "--port", str(free_port()), timeout=20)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "silent" in lines[0], done.stderr


@pytest.mark.parametrize("sqlstate, fault", [("40P01", "busy"), ("55P03", "busy"), ("53100", "full"),
                                              ("25006", "read_only"), ("08006", "io_error"), ("57P01", "io_error"),
                                              ("23505", None), ("42P01", None)])
def test_postgresql_errors_are_classified_as_storage_faults(sqlstate, fault):
    import psycopg
    from django.db import utils

    from pool import storage

    raised = psycopg.errors.lookup(sqlstate)("from the server")
    try:
        raise utils.OperationalError(str(raised)) from raised     # as Django wraps it
    except utils.OperationalError as wrapped:
        assert storage.classify(wrapped) == fault
    assert storage.classify(psycopg.OperationalError("connection refused")) == "io_error"   # no server answered


# ---- the services themselves --------------------------------------------------------------------

def test_each_caller_gets_a_database_and_a_redis_index_of_its_own(postgres, redis):
    import redis as redis_client

    first, second = postgres.new_database("same"), postgres.new_database("same")
    assert first != second
    postgres.query(first, "CREATE TABLE mine (x int)")
    assert not postgres.query(second, "SELECT 1 FROM pg_tables WHERE tablename = 'mine'")

    one, two = redis.new_url(), redis.new_url()
    assert one.rsplit("/", 1)[1] != two.rsplit("/", 1)[1]
    with redis_client.Redis.from_url(one) as a, redis_client.Redis.from_url(two) as b:
        a.set("k", "1")
        assert b.get("k") is None and a.get("k") == b"1"
