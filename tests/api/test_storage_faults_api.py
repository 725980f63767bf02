"""Storage faults against a real server process: the database locked by another process, the data
folder full or read-only, and kill -9 during bursts of settings writes and during a prompt-cache
spill. In each, the models keep serving, a client's write that cannot be stored is a clear error
(and not applied), and nothing the server acknowledged or recorded is lost.

How the faults are made, honestly:
- locked: this test process holds BEGIN EXCLUSIVE on the server's omlx.sqlite3 through sqlite3;
- full: OMLX_HOME on a small tmpfs, filled to the last byte by a file (root: `mount -t tmpfs`);
- read-only: OMLX_HOME is a bind mount; a read-only bind of the same folder is mounted over it while
  the server runs. Files and connections opened after that get EROFS / SQLITE_READONLY (the tests
  run as root, so chmod would not stop a write). Descriptors opened before keep writing, as they
  would not on a file system the kernel remounts read-only: the long-lived telemetry connection,
  for one, goes on storing. Both mount cases are skipped where this process may not mount.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pool.catalog.model_ids import safe_name
from tests.conftest import DEMO

STAND_IN_DEMO = True   # shapes, errors and faults, not answers: tests/conftest.py demo_folder

# These stay on Daphne processes: kill -9, another process's lock, mounts over the data folder and the
# server's own log need a server process of its own.
OTHER = "storage-other"
BUSY = 1          # OMLX_DB_BUSY_TIMEOUT for these servers, seconds


def scrape(server) -> dict[tuple[str, tuple], float]:
    text = server.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def gauge(server, name: str, **labels) -> float | None:
    return scrape(server).get((name, tuple(sorted(labels.items()))))


def settings(server, model: str, **changes) -> httpx.Response:
    return server.post(f"/admin/model/{model}/settings", changes)


def chat(server, content: str = "hi", **body) -> httpx.Response:
    return server.post("/v1/chat/completions", {"model": DEMO, "messages": [{"role": "user", "content": content}],
                                                "max_tokens": 4, "temperature": 0, **body})


def hold_lock(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    return conn


def integrity(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def storage_events(server, component: str) -> list[dict]:
    return [e for e in server.events(limit=200)
            if e["reason"] in ("storage_fault", "storage_recovered") and e["detail"].startswith(component + ":")]


def log_count(server, text: str) -> int:
    return server.log_text().count(text)


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture
def mounts():
    """Mount points made by a test, unmounted (last first) at its end: ask for it before
    start_server, so the server stops before its data folder goes."""
    made: list[Path] = []

    def add(*args: str, at: Path) -> Path:
        at.mkdir(parents=True, exist_ok=True)
        if subprocess.run(["mount", *args, str(at)], capture_output=True).returncode != 0:
            pytest.skip("cannot mount here (needs root): this fault runs where it can")
        made.append(at)
        return at
    yield add
    for point in reversed(made):
        subprocess.run(["umount", "-l", str(point)], check=False)


def home_at(folder: Path, migrated_db: Path) -> dict:
    """Environment for a server whose data folder is `folder` (the models stay where start_server
    puts them, and so does its log)."""
    shutil.copy(migrated_db, folder / "omlx.sqlite3")
    return {"OMLX_HOME": str(folder)}


# ---- the database locked by another process ---------------------------------------------------

def test_a_locked_database_answers_503_keeps_serving_and_loses_no_history_row(start_server, make_model):
    server = start_server({OTHER: make_model(OTHER, 8)}, OMLX_DB_BUSY_TIMEOUT=str(BUSY), OMLX_STORAGE_SETTLE="1")
    db = server.home / "omlx.sqlite3"
    assert chat(server).status_code == 200
    assert server.post(f"/api/models/{OTHER}/load", {}).status_code == 200

    lock = hold_lock(db)
    try:
        started = time.monotonic()
        refused = settings(server, DEMO, is_pinned=True)
        took = time.monotonic() - started
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "database_busy"
        assert refused.headers["Retry-After"] == str(BUSY) and took < BUSY + 3
        assert server.model(DEMO)["pinned"] is False                      # not applied either
        assert server.get(f"/admin/model/{DEMO}/settings").json()["is_pinned"] is False   # reads go on

        assert chat(server, "still there?").status_code == 200           # serving goes on
        started = time.monotonic()
        unloaded = server.post(f"/api/models/{OTHER}/unload", {})
        assert unloaded.status_code == 200 and "history row waits" in unloaded.json()["note"]
        assert time.monotonic() - started < BUSY + 2                      # no busy timeout waited out
        (unload,) = [e for e in server.events(model=OTHER) if e["reason"] == "manual"]
        assert unload["stored"] is False                                  # kept, and shown as such
        assert gauge(server, "storage_failing", component="database") == 1
        assert gauge(server, "storage_pending_rows", component="database") >= 1
    finally:
        lock.execute("ROLLBACK")
        lock.close()

    server.wait_for(lambda: gauge(server, "storage_pending_rows", component="database") == 0)
    (unload,) = [e for e in server.events(model=OTHER) if e["reason"] == "manual"]
    assert "stored" not in unload and unload["id"] and unload["freed_bytes"] is not None
    assert gauge(server, "storage_failing", component="database") == 0
    # the recovery is reported once writes have worked for OMLX_STORAGE_SETTLE, on an enforcer tick
    server.wait_for(lambda: server.post("/api/enforcer/tick", {}) and len(storage_events(server, "database")) == 2)
    assert [e["reason"] for e in storage_events(server, "database")] == ["storage_recovered", "storage_fault"]
    assert log_count(server, "storage fault, database") == 1

    assert settings(server, DEMO, is_pinned=True).status_code == 200     # the client's retry works
    assert integrity(db) == "ok"
    with sqlite3.connect(db) as conn:                                     # what a restart reads
        assert conn.execute("SELECT is_pinned FROM pool_modelsettings WHERE model_id = ?", (DEMO,)).fetchone() == (1,)
        assert conn.execute("SELECT reason FROM pool_evictionevent WHERE model_id = ?", (OTHER,)).fetchall() \
            == [("manual",)]


# ---- the data folder full, then read-only ------------------------------------------------------

def test_a_full_data_folder_keeps_serving_reports_once_and_refuses_a_settings_write(
        mounts, start_server, migrated_db, tmp_path):
    home = mounts("-t", "tmpfs", "-o", "size=48m", "tmpfs", at=tmp_path / "full-home")
    # a disk at the edge of full takes a write now and then (a failed spill frees its half file):
    # one episode each, however long the test's fault lasts
    # one entry in memory: each chat pushes the last one out, and so spills it
    server = start_server(**home_at(home, migrated_db), OMLX_STORAGE_SETTLE="120", OMLX_PROMPT_CACHE_ENTRIES="1")
    assert chat(server, "a first question").status_code == 200
    assert chat(server, "a first question again").status_code == 200
    server.wait_for(lambda: list((home / "prompt-cache" / safe_name(DEMO)).glob("*.safetensors")))   # spills work

    # The last connection to a WAL database deletes its -wal and -shm files as it closes, which frees
    # their blocks (about 100 KB here) for the next write: the test's own connection keeps them.
    keeper = sqlite3.connect(home / "omlx.sqlite3")
    keeper.execute("SELECT count(*) FROM sqlite_master").fetchall()
    filler = home / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 2**16)
        except OSError:
            pass
    for question in ("a second question", "a third question"):
        assert chat(server, question).status_code == 200                 # chats go on
    for _ in range(12):                                                   # telemetry rows, batched by ten
        assert server.post("/api/enforcer/tick", {}).status_code == 200
    server.wait_for(lambda: gauge(server, "storage_failing", component="telemetry") == 1)
    server.wait_for(lambda: gauge(server, "storage_failing", component="prompt_cache") == 1)
    assert gauge(server, "storage_fault", component="telemetry", fault="full") == 1
    assert gauge(server, "storage_fault", component="prompt_cache", fault="full") == 1

    refused = settings(server, DEMO, is_pinned=True)
    assert refused.status_code == 507 and refused.json()["error"]["code"] == "storage_full", refused.text
    assert server.model(DEMO)["pinned"] is False
    answer = server.get("/api/telemetry", params={"since": 0})
    assert answer.status_code == 200 and "the disk is full" in answer.json()["note"]
    during = {p["t"] for p in answer.json()["points"]}

    for i in range(10):                                                   # more ticks, more spills
        server.post("/api/enforcer/tick", {})
        if i % 4 == 0:
            assert chat(server, f"one more, {i}").status_code == 200
    for component in ("telemetry", "prompt_cache"):                      # once, not per tick or spill
        assert log_count(server, f"storage fault, {component}") == 1
        assert [e["reason"] for e in server.pool()["events"]
                if e["reason"] == "storage_fault" and e["detail"].startswith(component)] == ["storage_fault"]

    filler.unlink()                                                       # space again
    keeper.close()
    assert settings(server, DEMO, is_pinned=True).status_code == 200
    assert chat(server, "a fifth question").status_code == 200
    server.wait_for(lambda: gauge(server, "storage_failing", component="prompt_cache") == 0, timeout=30)
    server.wait_for(lambda: gauge(server, "storage_pending_rows", component="database") == 0, timeout=30)
    deadline = time.monotonic() + 30                                      # retried every 5 s, on a tick
    while gauge(server, "storage_failing", component="telemetry") != 0 and time.monotonic() < deadline:
        server.post("/api/enforcer/tick", {})
        time.sleep(0.5)
    assert gauge(server, "storage_failing", component="telemetry") == 0
    answer = server.get("/api/telemetry", params={"since": 0}).json()
    assert "note" not in answer and during <= {p["t"] for p in answer["points"]}   # every tick kept, stored
    assert [e["reason"] for e in storage_events(server, "telemetry")] == ["storage_fault"]   # written late
    server.stop()
    assert integrity(home / "omlx.sqlite3") == "ok"


def test_a_read_only_data_folder_keeps_serving_and_refuses_a_settings_write(
        mounts, start_server, migrated_db, tmp_path):
    real = mounts("-t", "tmpfs", "-o", "size=64m", "tmpfs", at=tmp_path / "real-home")
    home = mounts("--bind", str(real), at=tmp_path / "home-view")
    server = start_server(**home_at(home, migrated_db), OMLX_PROMPT_CACHE_ENTRIES="1")   # each chat spills
    assert chat(server, "a first question").status_code == 200

    mounts("--bind", "-o", "ro", str(real), at=home)                      # read-only from now on
    assert chat(server, "a second question").status_code == 200
    refused = settings(server, DEMO, ttl_seconds=60)
    assert refused.status_code == 507 and refused.json()["error"]["code"] == "storage_read_only", refused.text
    assert server.get(f"/admin/model/{DEMO}/settings").json()["ttl_seconds"] is None
    assert chat(server, "a third question").status_code == 200
    server.wait_for(lambda: gauge(server, "storage_fault", component="prompt_cache", fault="read_only") == 1)
    assert server.get("/api/telemetry").status_code == 200
    assert log_count(server, "storage fault, prompt_cache") == 1

    subprocess.run(["umount", "-l", str(home)], check=True)               # writable again
    assert settings(server, DEMO, ttl_seconds=60).status_code == 200
    assert server.get(f"/admin/model/{DEMO}/settings").json()["ttl_seconds"] == 60
    server.stop()
    assert integrity(real / "omlx.sqlite3") == "ok"


# ---- kill -9 ----------------------------------------------------------------------------------

def test_kill_9_during_bursts_of_settings_writes_keeps_every_acknowledged_write(start_server, make_model):
    server = start_server({OTHER: make_model(OTHER, 8)})
    acknowledged: dict[str, int] = {}
    refused: list[str] = []
    stop = threading.Event()

    def burst(model: str) -> None:
        with httpx.Client(timeout=10) as client:
            for i in range(1, 100_000):
                if stop.is_set():
                    return
                try:
                    r = client.post(f"{server.url}/admin/model/{model}/settings",
                                    json={"ttl_seconds": i, "is_pinned": i % 2 == 0, "notes": f"write {i}"})
                except httpx.HTTPError:
                    return                                # the server is gone
                if r.status_code != 200:
                    refused.append(r.text)
                    return
                acknowledged[model] = i

    threads = [threading.Thread(target=burst, args=(m,)) for m in (DEMO, OTHER)]
    [t.start() for t in threads]
    server.wait_for(lambda: min(acknowledged.get(m, 0) for m in (DEMO, OTHER)) >= 20, timeout=60)
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    stop.set()
    [t.join(20) for t in threads]
    assert not refused

    db = server.home / "omlx.sqlite3"
    assert integrity(db) == "ok"
    with sqlite3.connect(db) as conn:
        rows = {m: (ttl, pinned, notes) for m, ttl, pinned, notes in
                conn.execute("SELECT model_id, ttl_seconds, is_pinned, notes FROM pool_modelsettings")}
    for model, last in acknowledged.items():
        ttl, pinned, notes = rows[model]
        assert ttl in (last, last + 1)                    # the last acknowledged, or one in flight
        assert (bool(pinned), notes) == (ttl % 2 == 0, f"write {ttl}")    # one whole write, never half
    server.start()
    for model in acknowledged:
        assert server.get(f"/admin/model/{model}/settings").json()["ttl_seconds"] == rows[model][0]


def test_kill_9_during_a_prompt_cache_spill_never_serves_a_half_file(start_server, demo_model_dir):
    from mlx_lm.models.cache import load_prompt_cache

    # the real demo: its entries are large enough for a spill to be caught half written
    server = start_server({DEMO: demo_model_dir}, demo=False, OMLX_PROMPT_CACHE_ENTRIES="2")   # the third spills
    folder = server.home / "prompt-cache" / safe_name(DEMO)
    prompts = [f"Story {i}: " + "the knight walked across the old stone bridge at dawn, " * 25 for i in range(40)]
    answers: dict[str, str] = {}
    seen_partial = threading.Event()

    def chats() -> None:
        for prompt in prompts:
            try:
                r = chat(server, prompt, max_tokens=3)
            except httpx.HTTPError:
                return
            if r.status_code == 200:
                answers[prompt] = r.json()["choices"][0]["message"]["content"]

    def files() -> set[str]:
        if not folder.is_dir():
            return set()
        with os.scandir(folder) as entries:
            return {e.name for e in entries if e.name.endswith(".safetensors")}

    def partials_of(names: set[str]) -> set[str]:
        return {name for name in names if name.endswith(".partial.safetensors")}

    def partials() -> set[str]:
        return partials_of(files())

    talker = threading.Thread(target=chats)
    talker.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and talker.is_alive():
        found = files()
        if partials_of(found) and len(partials_of(found)) < len(found):   # one spill done, one under way
            os.killpg(server.proc.pid, signal.SIGKILL)    # mid-spill: a half-written file is on disk
            server.proc.wait()
            seen_partial.set()
            break
        time.sleep(0.001)
    talker.join(60)
    assert seen_partial.is_set(), "no spill was caught in progress"
    half_files = partials()
    assert half_files
    assert integrity(server.home / "omlx.sqlite3") == "ok"

    server.start()
    assert server.post(f"/api/models/{DEMO}/load", {}).status_code == 200   # its disk tier opens
    assert not partials()                                                 # the kill's half file is gone
    for prompt in [p for p in prompts if p in answers]:                   # same answers, from the disk tier
        again = chat(server, prompt, max_tokens=3)
        assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"] == answers[prompt]
    assert server.model(DEMO)["prompt_cache_disk_hits"] >= 1
    server.wait_for(lambda: not partials() and time.sleep(0.5) is None and not partials())   # spills done
    for path in folder.glob("*.safetensors"):                             # every served file loads whole
        cache, metadata = load_prompt_cache(str(path), return_metadata=True)
        assert cache and metadata["tokens"]
