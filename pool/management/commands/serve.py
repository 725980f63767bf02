"""`python manage.py serve [--host H] [--port P] [--allow-remote-without-key]`: Daphne serving
omlx_site.asgi:application.

The database is brought up to date first (a new OMLX_HOME needs no separate migrate), or the
command exits non-zero with the reason in one line. Without OMLX_API_KEY it listens on loopback
only: another address needs --allow-remote-without-key, and a warning is printed. The pool, the
enforcer and pinned-model preloads start as soon as the server is ready. SIGTERM or SIGINT stops it
gracefully (omlx_site/server.py): running requests get OMLX_SHUTDOWN_GRACE seconds, then the
engine threads end, the database closes, and the process exits 0."""

import asyncio
import logging
import os
import sys

from django.core.management.base import BaseCommand, CommandError

from pool.conf import get_settings
from pool.network import advertised_names, hosts_for, is_loopback

log = logging.getLogger("pool")

ALLOW_FLAG = "--allow-remote-without-key"


class Command(BaseCommand):
    help = "Serve the OpenAI-style API and the dashboard with Daphne."
    requires_system_checks = []

    def add_arguments(self, parser):
        conf = get_settings()
        parser.add_argument("--host", default=conf.host)
        parser.add_argument("--port", type=int, default=conf.port)
        parser.add_argument(ALLOW_FLAG, action="store_true", dest="allow_remote_without_key",
                            help="listen on a non-loopback address although OMLX_API_KEY is unset")

    def handle(self, *args, host, port, allow_remote_without_key=False, **options):
        self._adopt_host(host, port)
        self._check_exposure(host, allow_remote_without_key)
        self._check_fleet()
        self._prepare_database()
        self._say_blas()
        conf = get_settings()
        sys.setswitchinterval(conf.switch_interval)
        from daphne.endpoints import build_endpoint_description_strings

        # omlx_site.server installs Twisted's asyncio reactor: before anything imports the reactor
        from omlx_site.server import GracefulStop, OmlxServer  # isort: skip
        from omlx_site.channel import Limits  # isort: skip
        from twisted.internet import defer, reactor  # isort: skip

        from omlx_site.asgi import application, in_flight
        from pool.runtime import get_runtime

        runtime = get_runtime()
        server = OmlxServer(application=application, endpoints=build_endpoint_description_strings(host=host, port=port),
                            ready_callable=lambda: ready(), signal_handlers=False, verbosity=0,
                            application_close_timeout=5, websocket_handshake_timeout=5,
                            limits=Limits(header_timeout=conf.header_timeout, idle_timeout=conf.idle_timeout,
                                          per_client=conf.max_connections_per_client, fleet_key=conf.fleet_key))
        stop = GracefulStop(server=server, in_flight=in_flight, runtime=runtime, grace=conf.shutdown_grace)

        def ready():
            stop.install()
            asyncio.ensure_future(runtime.start())
            self.stdout.write(f"omlx-site serving on http://{host}:{port}/ (models in "
                              f"{', '.join(str(d) for d in runtime.settings.model_dirs)})")
            self.stdout.flush()

        async def stop_runtime():
            from asgiref.sync import sync_to_async
            from django.db import connections

            await runtime.stop()
            await sync_to_async(connections.close_all)()   # the background writes' thread
            log.info("stopped: engines ended, database closed")

        reactor.addSystemEventTrigger("before", "shutdown",
                                      lambda: defer.Deferred.fromFuture(asyncio.ensure_future(stop_runtime())))
        logging.getLogger("daphne").setLevel(logging.WARNING)
        server.run()
        from django.db import connections

        connections.close_all()
        sys.stdout.flush()

    def _check_exposure(self, host: str, allowed: bool) -> None:
        if get_settings().api_key or is_loopback(host):
            return
        if not allowed:
            raise CommandError(f"refusing to listen on {host} without OMLX_API_KEY: anyone who can reach it "
                               f"could use the API; set OMLX_API_KEY, or pass {ALLOW_FLAG}")
        self.stderr.write(f"WARNING: listening on {host} without OMLX_API_KEY: /v1/* and Ollama's routes are open "
                          "to every client that can reach this port; the operator's /api/*, /metrics and the "
                          "dashboard answer loopback clients (or a staff login) only.")

    def _say_blas(self) -> None:
        from omlx_site import blas

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
    def _adopt_host(host: str, port: int) -> None:
        """`--host` and `--port` win over OMLX_HOST and OMLX_PORT everywhere: the loopback rules, the
        host's name in a fleet, and ALLOWED_HOSTS, which holds the names this server answers to (not
        the test client's `testserver`; the advertised one, which the other hosts of a fleet use)."""
        from django.conf import settings

        from pool.conf import reload_settings

        if host != get_settings().host or port != get_settings().port:
            os.environ["OMLX_HOST"], os.environ["OMLX_PORT"] = host, str(port)
            reload_settings()
        settings.ALLOWED_HOSTS = hosts_for(host, get_settings().allowed_hosts) + advertised_names(get_settings())

    def _check_fleet(self) -> None:
        """A fleet needs its key, and a Redis that answers: refused at start, in one line, not later."""
        conf = get_settings()
        if not conf.redis_url:
            return
        if not conf.fleet_key:
            raise CommandError("OMLX_REDIS_URL is set but OMLX_FLEET_KEY is not: every host of a fleet needs the same "
                               "secret key for the calls between hosts (docs/fleet.md)")
        import redis

        try:
            redis.Redis.from_url(conf.redis_url, socket_connect_timeout=3, socket_timeout=3).ping()
        except redis.RedisError as e:
            raise CommandError(f"cannot reach the fleet's Redis at OMLX_REDIS_URL: {e}") from None
        self.stdout.write(f"fleet: this host is {conf.host_id}, reached at {conf.advertise_url}")
