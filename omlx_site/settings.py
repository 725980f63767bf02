"""Django settings. Everything a user sets comes from pool.conf (OMLX_* environment variables)."""

import secrets
from pathlib import Path

import dj_database_url

from pool.conf import get_settings
from pool.network import advertised_names, hosts_for

BASE_DIR = Path(__file__).resolve().parent.parent
OMLX = get_settings()


def _secret_key() -> str:
    # Persisted so that staff sessions survive a restart; never committed. A data folder that
    # cannot be written gets a key for this process only: `serve` then says why it cannot start.
    path = OMLX.home / "secret_key"
    try:
        OMLX.home.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text(secrets.token_urlsafe(50))
            path.chmod(0o600)
        return path.read_text().strip()
    except OSError:
        return secrets.token_urlsafe(50)


SECRET_KEY = _secret_key()
DEBUG = False
# Only the names this server answers to (DNS rebinding: a page on evil.example that resolves to
# this machine is refused). `serve` recomputes it for its --host, without the test client's name.
ALLOWED_HOSTS = [*hosts_for(OMLX.host, OMLX.allowed_hosts), *advertised_names(OMLX), "testserver"]
# A refused CSRF check answers the API's envelope on API paths, Django's page elsewhere.
CSRF_FAILURE_VIEW = "pool.api.django_handlers.csrf_failure"

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "pool",
    "pool.traces.apps.TracesConfig",
    "pool.keys",
    "dashboard",
]

MIDDLEWARE = [
    "pool.api.host_header.host_header",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "omlx_site.urls"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

ASGI_APPLICATION = "omlx_site.asgi.application"
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
if OMLX.redis_url:
    # a fleet: every host's dashboards hear every host (docs/fleet.md); whole snapshots only, since the
    # Redis layer drops what a full channel cannot take
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                  "CONFIG": {"hosts": [OMLX.redis_url], "prefix": "omlx:channels"}}}

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": OMLX.home / "omlx.sqlite3",
        "OPTIONS": {
            # WAL survives a kill -9 with committed rows intact and lets readers run beside the writer.
            # synchronous=NORMAL under WAL: a kill -9 keeps every committed write (only a power cut
            # may lose the last ones).
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            # How long a write waits for another process's lock before it fails: settings writes
            # then answer 503 `database_busy` with Retry-After (pool/storage.py), never hang.
            "timeout": max(0.1, OMLX.db_busy_timeout),
            "transaction_mode": "IMMEDIATE",
        },
    }
}
if OMLX.database_url:
    # a fleet's shared database: settings, pins, aliases, users and every host's history (telemetry
    # stays in each host's $OMLX_HOME)
    DATABASES["default"] = dj_database_url.parse(OMLX.database_url, conn_max_age=0, conn_health_checks=True)
    # libpq waits forever for a server that takes the connection and never answers; `?connect_timeout=` wins
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", 10)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# Prompts can be long: Django's 2.5 MB default would refuse a big context before we could.
DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 2**20

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
LOGIN_URL = "/admin/login/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "pool": {"handlers": ["console"], "level": "INFO"},
        "dashboard": {"handlers": ["console"], "level": "INFO"},
    },
}
