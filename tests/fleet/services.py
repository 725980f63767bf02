"""A real PostgreSQL and a real Redis for the fleet tests, on free loopback ports, in a folder of
their own: started, waited for, handed out (a database or a Redis db index per caller) and stopped
cleanly. No pytest here: tests/fleet/conftest.py shares one of each between the xdist workers.

Both servers run detached from the process that started them (pg_ctl's postmaster, Redis
daemonized), so that whichever process is the last to need them can stop them: `Postgres` and
`Redis` are handles that `describe()` themselves as plain JSON and `attach()` again elsewhere."""

from __future__ import annotations

import fcntl
import glob
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PG_USER = "omlx"           # the role the servers under test log in as (password, CREATEDB)
PG_SUPERUSER = "postgres"  # initdb's superuser; reached over the unix socket only (trust)
REDIS_DATABASES = 256


class ServiceError(RuntimeError):
    """A service did not start or stop; the message has the end of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def _wait(check, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 (not up yet: any error of the client means "try again")
            last = e
        time.sleep(0.1)
    raise ServiceError(f"{what} did not accept connections within {timeout:.0f} s ({last!r}):\n{_tail(log)}")


def pid_alive(pid: int) -> bool:
    """A running process (a zombie nobody reaps yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


# ---- PostgreSQL ---------------------------------------------------------------------------------

def pg_bin(name: str) -> str:
    """Debian's /usr/lib/postgresql/<newest>/bin/<name>, else one on PATH."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    if found:
        return found[-1]
    on_path = shutil.which(name)
    if on_path is None:
        raise ServiceError(f"no PostgreSQL {name} found (`make services` installs Debian's postgresql)")
    return on_path


def _as_owner(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, its programs run as the `postgres` user."""
    return ["runuser", "-u", PG_SUPERUSER, "--", *cmd] if os.geteuid() == 0 else cmd


def _give_to_owner(path: Path) -> None:
    if os.geteuid() != 0:
        return
    try:
        owner = pwd.getpwnam(PG_SUPERUSER)
    except KeyError:
        raise ServiceError(f"PostgreSQL will not run as root, and there is no `{PG_SUPERUSER}` user to run it "
                           "(Debian's postgresql package makes one)") from None
    os.chown(path, owner.pw_uid, owner.pw_gid)


class Postgres:
    """A PostgreSQL cluster in `folder` (data/, sock/, postgres.log) listening on 127.0.0.1:port."""

    def __init__(self, folder: Path, port: int, password: str):
        self.folder, self.port, self.password = Path(folder), port, password
        self.data, self.sockets, self.log = self.folder / "data", self.folder / "sock", self.folder / "postgres.log"

    @classmethod
    def start(cls, folder: Path | None = None, *, timeout: float = 60) -> Postgres:
        folder = Path(folder or tempfile.mkdtemp(prefix="omlx-pg-"))
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)
        _give_to_owner(folder)
        pg = cls(folder, 0, secrets.token_hex(12))
        try:
            pg._initdb()
            for attempt in range(3):   # a free port may be taken before the postmaster binds it
                pg.port = free_port()
                try:
                    pg._pg_ctl_start(timeout)
                    break
                except ServiceError:
                    if attempt == 2:
                        raise
            with pg._admin() as db:
                db.execute(f"CREATE ROLE {PG_USER} LOGIN CREATEDB PASSWORD '{pg.password}'")
            _wait(pg._logs_in, timeout, f"PostgreSQL (as {PG_USER} over TCP)", pg.log)
        except BaseException:
            pg.stop()
            raise
        return pg

    def _pg_ctl_start(self, timeout: float) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.sockets} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        self._run([pg_bin("pg_ctl"), "start", "-D", str(self.data), "-l", str(self.log), "-w",
                   "-t", str(int(timeout)), "-o", options], timeout + 10)
        _wait(self._accepts, timeout, "PostgreSQL", self.log)

    def _pg_ctl_stop(self, timeout: float) -> None:
        """pg_ctl stop -m fast (immediate, then SIGKILL, if that fails)."""
        pid = self.pid()
        if pid is None or not pid_alive(pid):
            return
        for mode in ("fast", "immediate"):
            try:
                self._run([pg_bin("pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w",
                           "-t", str(int(timeout))], timeout + 10)
                break
            except (ServiceError, subprocess.TimeoutExpired):
                continue
        if not _wait_gone(pid, timeout):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 10)

    def pause(self, timeout: float = 30) -> None:
        """The server stops, its data kept: an outage, until `resume()`."""
        self._pg_ctl_stop(timeout)

    def resume(self, timeout: float = 60) -> None:
        """The server starts again on the same port, with the same data."""
        self._pg_ctl_start(timeout)
        _wait(self._logs_in, timeout, f"PostgreSQL (as {PG_USER} over TCP)", self.log)

    def _initdb(self) -> None:
        for sub in (self.data, self.sockets):
            sub.mkdir(mode=0o700, exist_ok=True)
            _give_to_owner(sub)
        self._run([pg_bin("initdb"), "-D", str(self.data), "-U", PG_SUPERUSER, "-E", "UTF8", "--no-locale",
                   "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"], 120)

    def _run(self, cmd: list[str], timeout: float) -> None:
        out = self.folder / "commands.log"
        with open(out, "ab") as log:
            # output to a file, never a pipe: a daemon that kept a pipe open would hang the read
            done = subprocess.run(_as_owner(cmd), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout, check=False)
        if done.returncode != 0:
            raise ServiceError(f"{' '.join(cmd[:2])} failed ({done.returncode}):\n{_tail(out)}\n{_tail(self.log)}")

    def _admin(self, dbname: str = "postgres"):
        import psycopg

        return psycopg.connect(host=str(self.sockets), port=self.port, user=PG_SUPERUSER, dbname=dbname,
                               autocommit=True, connect_timeout=5)

    def _accepts(self) -> bool:
        with self._admin() as db:
            db.execute("SELECT 1")
        return True

    def _logs_in(self) -> bool:
        """`omlx` gets in over TCP with its password, as the servers under test will."""
        import psycopg

        with psycopg.connect(self.url("postgres"), connect_timeout=2) as db:
            db.execute("SELECT 1")
        return True

    def url(self, database: str) -> str:
        return f"postgres://{PG_USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def new_database(self, name: str = "omlx") -> str:
        """A new empty database owned by `omlx`, with a unique name that starts with `name`; its URL."""
        stem = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")[:40] or "db"
        database = f"{stem}_{os.getpid()}_{secrets.token_hex(4)}"
        with self._admin() as db:
            db.execute(f'CREATE DATABASE "{database}" OWNER {PG_USER}')
        return self.url(database)

    def query(self, url_or_database: str, sql: str, params: tuple = ()) -> list[tuple]:
        """Rows of `sql` on one database (a URL from new_database, or its name), as the superuser."""
        database = url_or_database.rsplit("/", 1)[-1]
        with self._admin(database) as db:
            cursor = db.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self, timeout: float = 30) -> None:
        """The server stopped (pg_ctl stop -m fast) and its folder removed."""
        try:
            self._pg_ctl_stop(timeout)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def describe(self) -> dict:
        return {"folder": str(self.folder), "port": self.port, "password": self.password}

    @classmethod
    def attach(cls, description: dict) -> Postgres:
        return cls(Path(description["folder"]), description["port"], description["password"])


# ---- Redis --------------------------------------------------------------------------------------

class Redis:
    """A Redis in `folder` (redis.pid, redis.log) on 127.0.0.1:port, with 256 databases handed out
    one per caller (`new_url`): a counter in the folder, under a file lock, so every process that
    attaches to it gets a different index."""

    def __init__(self, folder: Path, port: int):
        self.folder, self.port = Path(folder), port
        self.log, self.pidfile = self.folder / "redis.log", self.folder / "redis.pid"

    @classmethod
    def start(cls, folder: Path | None = None, *, timeout: float = 30) -> Redis:
        folder = Path(folder or tempfile.mkdtemp(prefix="omlx-redis-"))
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        for attempt in range(3):   # a free port may be taken before it binds it
            folder.mkdir(parents=True, exist_ok=True)
            redis = cls(folder, free_port())
            done = subprocess.run([binary, "--port", str(redis.port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--databases", str(REDIS_DATABASES), "--dir", str(folder),
                                   "--daemonize", "yes", "--pidfile", str(redis.pidfile), "--logfile", str(redis.log)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  timeout=timeout, check=False)
            try:
                if done.returncode != 0:
                    raise ServiceError(f"redis-server exited {done.returncode}:\n{_tail(redis.log)}")
                _wait(redis._accepts, timeout, "Redis", redis.log)
                return redis
            except ServiceError:
                redis.stop()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _client(self, db: int = 0):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, db=db, socket_timeout=5, socket_connect_timeout=2)

    def _accepts(self) -> bool:
        """It answers, and it is this one (its pid), not another Redis that took the port."""
        with self._client() as client:
            return self.pid() is not None and client.info("server")["process_id"] == self.pid()

    def _answers_as_ours(self) -> bool:
        try:
            return self._accepts()
        except Exception:  # noqa: BLE001 (gone, or not answering)
            return False

    def new_url(self) -> str:
        """redis://127.0.0.1:port/<index>: a database index no other caller got, emptied."""
        with open(self.folder / "next-db.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            counter = self.folder / "next-db"
            index = int(counter.read_text()) if counter.exists() else 0
            if index >= REDIS_DATABASES:
                raise ServiceError(f"all {REDIS_DATABASES} Redis databases are handed out")
            counter.write_text(str(index + 1))
        with self._client(index) as client:
            client.flushdb()
        return f"redis://127.0.0.1:{self.port}/{index}"

    def pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self, timeout: float = 15) -> None:
        """SHUTDOWN NOSAVE (SIGTERM, then SIGKILL, if it does not go), and the folder removed."""
        pid = self.pid()
        try:
            if pid is not None and self._answers_as_ours():
                try:   # a plain socket: redis-py retries its connection after the server went, for seconds
                    with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
                        conn.sendall(b"SHUTDOWN NOSAVE\r\n")
                        conn.recv(1024)   # b"" once it has closed the connection on its way out
                except OSError:
                    pass   # not answering: the signals below
            if pid is not None and not _wait_gone(pid, timeout):
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        break
                    if _wait_gone(pid, 5):
                        break
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def describe(self) -> dict:
        return {"folder": str(self.folder), "port": self.port}

    @classmethod
    def attach(cls, description: dict) -> Redis:
        return cls(Path(description["folder"]), description["port"])


def new_database(pg: Postgres, name: str = "omlx") -> str:
    """A postgres:// URL of a new, empty database with a unique name."""
    return pg.new_database(name)


def new_redis_url(redis: Redis) -> str:
    """A redis://127.0.0.1:port/<db index> URL with an index of its own."""
    return redis.new_url()
