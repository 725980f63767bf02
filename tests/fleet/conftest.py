"""One PostgreSQL and one Redis for the whole test run, shared by the xdist workers, started only
when a fleet test asks for one.

The workers of one run meet in <system temp>/omlx-fleet-<testrun uid>/: `state.json` says which
services run there and which workers hold them, and `lock` (fcntl.flock) guards it. The first worker
that needs a service starts it; each worker adds its pid to the holders when it first uses one and
removes it at the end of its session; the last holder to leave stops them and removes the folder.
Holders whose process is gone (a crashed worker) are not waited for."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tests.fleet.services import Postgres, Redis, pid_alive

KINDS = {"postgres": Postgres, "redis": Redis}


class SharedServices:
    """This worker's view of the run's shared services (tests/fleet/services.py)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.held = False
        self.handles: dict[str, Postgres | Redis] = {}

    @contextmanager
    def _locked(self) -> Iterator[dict]:
        """The state, read and written back under the run's lock."""
        while True:
            self.folder.mkdir(parents=True, exist_ok=True)
            lock = open(self.folder / "lock", "a+")
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = os.stat(self.folder / "lock").st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(lock.fileno()).st_ino:
                break
            lock.close()   # the last holder removed the folder meanwhile: meet in the new one
        with lock:
            path = self.folder / "state.json"
            state = json.loads(path.read_text()) if path.exists() else {"holders": [], "services": {}}
            try:
                yield state
            finally:   # whole or not at all, also when starting a service failed
                (self.folder / "state.json.new").write_text(json.dumps(state))
                os.replace(self.folder / "state.json.new", path)

    def get(self, kind: str) -> Postgres | Redis:
        if kind not in self.handles:
            with self._locked() as state:
                state["holders"] = [pid for pid in state["holders"] if pid_alive(pid)]
                if os.getpid() not in state["holders"]:
                    state["holders"].append(os.getpid())
                self.held = True
                description = state["services"].get(kind)
                if description is None:
                    service = KINDS[kind].start(self.folder / kind)
                    state["services"][kind] = service.describe()
                else:
                    service = KINDS[kind].attach(description)
                self.handles[kind] = service
        return self.handles[kind]

    def release(self) -> None:
        """Leave; the last holder stops every service and removes the folder."""
        if not self.held:
            return
        with self._locked() as state:
            state["holders"] = [pid for pid in state["holders"] if pid != os.getpid() and pid_alive(pid)]
            last = not state["holders"]
            if last:
                errors = []
                for kind, description in state["services"].items():
                    try:
                        KINDS[kind].attach(description).stop()
                    except Exception as e:  # noqa: BLE001 (stop the others, then report)
                        errors.append(f"{kind}: {e!r}")
                state["services"] = {}
        self.held = False
        if last:
            shutil.rmtree(self.folder, ignore_errors=True)
            assert not errors, f"a fleet service did not stop: {errors}"


def _run_uid(request) -> str:
    try:
        return request.getfixturevalue("testrun_uid")   # pytest-xdist's, the same in every worker
    except pytest.FixtureLookupError:
        return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"solo-{os.getpid()}"


@pytest.fixture(scope="session")
def fleet_services(request) -> Iterator[SharedServices]:
    shared = SharedServices(Path(tempfile.gettempdir()) / f"omlx-fleet-{_run_uid(request)}")
    yield shared
    shared.release()


@pytest.fixture(scope="session")
def postgres(fleet_services) -> Postgres:
    """The run's PostgreSQL: `new_database(name)` -> a postgres:// URL of a new empty database."""
    return fleet_services.get("postgres")


@pytest.fixture(scope="session")
def redis(fleet_services) -> Redis:
    """The run's Redis: `new_url()` -> a redis:// URL with a database index of its own."""
    return fleet_services.get("redis")


@pytest.fixture
def pg_url(postgres, request) -> str:
    """A fresh, empty PostgreSQL database for this test."""
    return postgres.new_database(request.node.name)


@pytest.fixture
def redis_url(redis) -> str:
    """A fresh Redis database index for this test."""
    return redis.new_url()
