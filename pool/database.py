"""The server owns its database: `serve` brings the schema up to date before it listens.

A new OMLX_HOME gets its tables here (no separate `migrate` step), and a database that cannot be
brought up to date (a read-only folder, a schema written by a newer omlx-site) stops the server
with one line that says why, instead of a server that answers 500 on every route."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from django.core.management import call_command
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

# hosts of a fleet that start together take turns on the shared schema (PostgreSQL's advisory lock)
MIGRATION_LOCK = 0x6F6D6C78


@contextmanager
def _migration_lock() -> Iterator[None]:
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK])


def _where() -> str:
    """The database's file, or a server database's name and address (never its password)."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return str(settings["NAME"])
    return f"{settings['NAME']} at {settings.get('HOST') or 'localhost'}:{settings.get('PORT') or 'default port'}"


class DatabaseNotReady(RuntimeError):
    """The schema cannot be brought up to date; the message is one line for the operator."""


def ensure_schema() -> int:
    """Apply pending migrations; returns how many were applied (0 when up to date)."""
    path = _where()
    try:
        executor = MigrationExecutor(connection)
        loader = executor.loader
        unknown = sorted(f"{app}.{name}" for app, name in loader.applied_migrations
                         if (app, name) not in loader.graph.nodes and app in loader.migrated_apps)
        if unknown:
            raise DatabaseNotReady(f"the database {path} has migrations this code does not know "
                                   f"({', '.join(unknown)}): it was written by a newer omlx-site")
        pending = executor.migration_plan(loader.graph.leaf_nodes())
        if pending:
            with _migration_lock():
                # another host may have applied them while this one waited for the lock
                executor = MigrationExecutor(connection)
                pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
                if pending:
                    call_command("migrate", interactive=False, verbosity=0)
        return len(pending)
    except DatabaseError as e:
        # one line: psycopg's messages carry a hint on a line of their own
        raise DatabaseNotReady(f"cannot prepare the database {path}: {' '.join(str(e).split())}") from None
    finally:
        connection.close()  # the event loop's thread opens its own
