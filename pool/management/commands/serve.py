"""`python manage.py serve [--host H] [--port P]`: Daphne serving omlx_site.asgi:application.

The database is brought up to date first (a new OMLX_HOME needs no separate migrate), or the
command exits non-zero with the reason in one line. The pool, the enforcer and pinned-model preloads start as soon as the server is ready, and stop
cleanly (engine threads ended, models released) before the reactor shuts down."""

import asyncio
import logging
import os
import sys

from django.core.management.base import BaseCommand, CommandError

from pool.conf import get_settings

log = logging.getLogger("pool")


class Command(BaseCommand):
    help = "Serve the OpenAI-style API and the dashboard with Daphne."
    requires_system_checks = []

    def add_arguments(self, parser):
        conf = get_settings()
        parser.add_argument("--host", default=conf.host)
        parser.add_argument("--port", type=int, default=conf.port)

    def handle(self, *args, host, port, **options):
        self._adopt_host(host)
        self._prepare_database()
        self._say_blas()
        sys.setswitchinterval(get_settings().switch_interval)
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server
        from twisted.internet import defer, reactor

        from omlx_site.asgi import application
        from pool.runtime import get_runtime

        runtime = get_runtime()

        def ready():
            asyncio.ensure_future(runtime.start())
            self.stdout.write(f"omlx-site serving on http://{host}:{port}/ (models in "
                              f"{', '.join(str(d) for d in runtime.settings.model_dirs)})")
            self.stdout.flush()

        def before_shutdown():
            return defer.Deferred.fromFuture(asyncio.ensure_future(runtime.stop()))

        reactor.addSystemEventTrigger("before", "shutdown", before_shutdown)
        logging.getLogger("daphne").setLevel(logging.WARNING)
        Server(application=application, endpoints=build_endpoint_description_strings(host=host, port=port), ready_callable=ready,
               application_close_timeout=5, websocket_handshake_timeout=5, verbosity=0).run()
        sys.stdout.flush()

    def _say_blas(self) -> None:
        from pool import blas

        if blas.state and blas.state["path"]:
            self.stdout.write(f"MLX CPU backend: {blas.state['blas']} BLAS loaded ({blas.state['path']}); "
                              f"OMLX_CPU_DEQUANTIZE={get_settings().cpu_dequantize}")

    def _prepare_database(self) -> None:
        from django.db import connection

        from pool.database import DatabaseNotReady, ensure_schema

        try:
            applied = ensure_schema()
        except DatabaseNotReady as e:
            raise CommandError(str(e)) from None
        if applied:
            self.stdout.write(f"database {connection.settings_dict['NAME']}: applied {applied} migration"
                              f"{'s' if applied > 1 else ''}")

    @staticmethod
    def _adopt_host(host: str) -> None:
        """`--host` wins over OMLX_HOST everywhere: the dashboard's loopback rule and ALLOWED_HOSTS."""
        from django.conf import settings

        from pool.conf import reload_settings

        if host == get_settings().host:
            return
        os.environ["OMLX_HOST"] = host
        reload_settings()
        if host in ("0.0.0.0", "::"):
            settings.ALLOWED_HOSTS = ["*"]
        elif host not in settings.ALLOWED_HOSTS:
            settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, host]
