"""Every OMLX_* setting in one place: its name, default, parser, group and one line of documentation,
and `Settings`, the typed values read from the environment once.

`get_settings()` reads them at its first call; `reload_settings()` reads them again (tests, and
`serve --host`). Code that needs a value takes it from a Settings object handed to it (the runtime's),
not from the environment. docs/configuration.md documents each entry of `SETTINGS` in its group's
table (a test checks that)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Literal

from .setting_parsers import (
    choice,
    flag,
    fraction,
    name_list,
    non_negative_int,
    optional_duration,
    parse_duration,
    parse_size,
    positive_int,
    size_or_keyword,
    tokens_or_auto,
    tokens_or_context,
)


def _hf_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


USER, TUNING, TESTING = "user", "tuning", "testing"   # where docs/configuration.md lists a setting


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    parse: Callable[[str], Any]
    doc: str
    group: str = USER      # USER: what people set; TUNING: measured and settled; TESTING: test seams


SETTINGS: list[Setting] = [
    Setting("OMLX_HOME", "~/.omlx-site", lambda t: Path(t).expanduser(),
            "data folder: SQLite database, telemetry, converted models"),
    Setting("OMLX_MODEL_DIRS", "", lambda t: [Path(p).expanduser() for p in t.split(os.pathsep) if p],
            "model folders separated by os.pathsep; empty = $OMLX_HOME/models plus the Hugging Face hub cache when it "
            "exists"),
    Setting("OMLX_HOST", "127.0.0.1", str, "address `serve` listens on"),
    Setting("OMLX_PORT", "8000", int, "port `serve` listens on"),
    Setting("OMLX_API_KEY", "", str,
            "unset = loopback only; set = /v1/*, /api/*, /metrics and the websocket need it (Bearer or x-api-key)"),
    Setting("OMLX_ALLOWED_HOSTS", "", name_list,
            "more names the server answers to (comma-separated; `.example.com` takes subdomains; `*` turns the Host "
            "check off)"),
    Setting("OMLX_METRICS_PUBLIC", "0", flag,
            "1 = /metrics answers without the key or from other machines, model ids left out; 0 = it needs what "
            "/api/* needs"),
    Setting("OMLX_SHUTDOWN_GRACE", "10", parse_duration,
            "seconds running requests may finish after SIGTERM before they are ended with an error"),
    Setting("OMLX_HEADER_TIMEOUT", "30", parse_duration,
            "seconds a client has to send a request's line and headers; then the connection is closed (0 = no limit)"),
    Setting("OMLX_IDLE_TIMEOUT", "60", parse_duration,
            "seconds a connection may stay silent while its request is read or between requests (never while "
            "answering); a finished answer the client reads none of for this long is dropped"),
    Setting("OMLX_MAX_CONNECTIONS_PER_CLIENT", "128", non_negative_int,
            "connections one client address may hold open; a request on one more is a 503 "
            "`too_many_connections` (the fleet's hosts are exempt); 0 = no cap"),
    Setting("OMLX_MAX_MODEL_MEMORY", "auto", size_or_keyword("auto", "off"),
            "model budget: a size, `auto` or `off`"),
    Setting("OMLX_MAX_LOADED_MODELS", "0", non_negative_int, "at most this many models loaded at once; 0 = no cap"),
    Setting("OMLX_IDLE_TTL", "off", optional_duration, "unload models idle this long (seconds or `5m`); `off` = never"),
    Setting("OMLX_MEMORY_CEILING", "auto", size_or_keyword("auto", "off"),
            "process memory ceiling for the enforcer: a size, `auto` or `off`"),
    Setting("OMLX_MEMORY_GUARD", "balanced", choice("safe", "balanced", "aggressive"),
            "reserve kept free under `auto` ceiling: safe 8 GiB, balanced 6 GiB, aggressive 4 GiB (4 GiB under 24 GiB "
            "RAM)"),
    Setting("OMLX_SOFT_FRACTION", "0.90", fraction, "soft pressure line as a fraction of the ceiling"),
    Setting("OMLX_HARD_FRACTION", "0.95", fraction, "hard pressure line as a fraction of the ceiling"),
    Setting("OMLX_ADMISSION_WAIT", "30", parse_duration, "seconds a new request may wait while admission is paused"),
    Setting("OMLX_LOAD_WAIT", "30", parse_duration,
            "seconds a load may wait for busy or loading models to become evictable before a 503"),
    Setting("OMLX_ADMISSION_QUEUE", "32", non_negative_int, "requests that may wait while admission is paused"),
    Setting("OMLX_MAX_CONCURRENT", "16", non_negative_int,
            "requests that generate on one model at once; more wait in its queue; 0 = no limit"),
    Setting("OMLX_QUEUE_PER_MODEL", "64", non_negative_int,
            "requests that may wait for one model's slot (first come first served); beyond that a 503"),
    Setting("OMLX_KEY_SHARE", "0.5", fraction,
            "the fraction of one model's slots and queue places one API key may hold while other keys wait; 1 = "
            "no share"),
    Setting("OMLX_PREFILL_STEP", "512", positive_int,
            "prompt tokens read per step; running streams decode a token between two steps (memory pressure lowers "
            "it)", group=TUNING),
    Setting("OMLX_PREFILL_STEP_ALONE", "auto", tokens_or_auto(cpu=256, gpu=2048),
            "prompt tokens read per step by a request alone on its model, with no stream to hold up; auto = 2048 "
            "(mlx-lm's own step) on a GPU, 256 on the CPU backend, where attention makes one long chunk slower than "
            "several short ones; memory pressure lowers it like OMLX_PREFILL_STEP", group=TUNING),
    Setting("OMLX_DRAFT_TOKENS", "3", positive_int,
            "tokens a model's draft proposes per round of speculative decoding (its `draft_model` setting)",
            group=TUNING),
    Setting("OMLX_DRAFT_MIN_ACCEPTANCE", "0.3", fraction,
            "below this share of its tokens accepted, a draft stops paying: its model decodes plainly",
            group=TUNING),
    Setting("OMLX_WARMUP", "auto", choice("auto", "on", "off"),
            "after a load, run the shapes the model will serve most (batches up to OMLX_MAX_CONCURRENT, a prompt "
            "of OMLX_PREFILL_STEP_ALONE) in the background, so the first requests do not compile kernels; auto = on a "
            "GPU, off on the CPU backend"),
    Setting("OMLX_MLX_CACHE_MAX", "1GiB", size_or_keyword("off"),
            "MLX's buffer cache is held within this by MLX itself, and what still passes it is cleared at the next "
            "enforcer tick, even when memory is ok; off = MLX's default bound, cleared only under pressure",
            group=TUNING),
    Setting("OMLX_LOAD_GROUP_BYTES", "64MiB", parse_size,
            "weight bytes evaluated at a time while a model loads: smaller groups hold other models' streams up for "
            "less, larger ones load faster", group=TUNING),
    Setting("OMLX_SSE_KEEPALIVE", "10", optional_duration,
            "seconds between SSE keep-alives (`: keep-alive` comments; `ping` events on /v1/messages) while a stream "
            "waits for its first token; `off` or 0 = none"),
    Setting("OMLX_CONTEXT_FALLBACK", "32768", positive_int,
            "context length (tokens) assumed for a model whose config.json names none; it caps prompt + max_tokens"),
    Setting("OMLX_PROMPT_CHARS_PER_TOKEN", "16", positive_int,
            "a prompt of more characters than the model's context times this is refused (400 "
            "`context_length_exceeded`) before it is tokenised", group=TUNING),
    Setting("OMLX_DEFAULT_MAX_TOKENS", "context", tokens_or_context,
            "tokens a request may generate when its client names no limit (and its model's settings none): a "
            "number, or `context` = the room the prompt leaves in the model's context (as Ollama's num_predict -1)"),
    Setting("OMLX_MAX_MESSAGES", "2048", positive_int,
            "messages one chat request may hold; more is a 400 naming `messages`"),
    Setting("OMLX_MAX_TOOLS", "128", positive_int, "tools one request may offer; more is a 400 naming `tools`"),
    Setting("OMLX_MAX_STOP_LENGTH", "256", positive_int,
            "characters in one stop string (`stop`, `stop_sequences`); longer is a 400 naming the field"),
    Setting("OMLX_MAX_IMAGES", "16", non_negative_int,
            "images one request may carry (every dialect); more is a 400 naming the image; 0 = images refused"),
    Setting("OMLX_MAX_IMAGE_BYTES", "20MB", parse_size, "one image's encoded bytes at most, checked before decoding"),
    Setting("OMLX_MAX_REQUEST_IMAGE_BYTES", "50MB", parse_size, "a request's images' encoded bytes at most, together"),
    Setting("OMLX_MAX_IMAGE_PIXELS", "50M", parse_size,
            "one image's width x height at most, checked from its header before its pixels are decoded"),
    Setting("OMLX_IMAGE_FETCH", "off", flag,
            "on = http(s) image URLs are fetched (public addresses only, every redirect checked, capped by the "
            "byte limits); off = they are a 400 and images come inline (data: URLs, base64)"),
    Setting("OMLX_IMAGE_FETCH_TIMEOUT", "10", parse_duration, "seconds one image URL's fetch may take in all"),
    Setting("OMLX_SWITCH_INTERVAL", "0.0005", float,
            "seconds a Python thread may hold the GIL while another waits (sys.setswitchinterval)", group=TUNING),
    Setting("OMLX_TELEMETRY_DAYS", "7", float, "days of enforcer telemetry kept"),
    Setting("OMLX_RESPONSES_DAYS", "30", float,
            "days a stored /v1/responses answer is kept for `previous_response_id` and GET; 0 = none stored"),
    Setting("OMLX_RESPONSES_MAX", "10000", non_negative_int,
            "stored /v1/responses answers kept at most (the oldest go first); 0 = no cap"),
    Setting("OMLX_RESPONSES_BYTES", "8MB", parse_size, "what one stored /v1/responses answer adds at most"),
    Setting("OMLX_RESPONSES_CHAIN_BYTES", "32MB", parse_size, "a previous_response_id conversation's items at most"),
    Setting("OMLX_TRACES", "on", flag, "keep a trace of every model request (`off`: none, nor their histograms)"),
    Setting("OMLX_TRACE_ROWS", "100000", non_negative_int,
            "request traces kept at most (the oldest go first); 0 = no cap"),
    Setting("OMLX_TRACE_DAYS", "7", float, "days a request trace is kept"),
    Setting("OMLX_DB_BUSY_TIMEOUT", "5", parse_duration,
            "seconds a settings write waits for another process's database lock before a 503 `database_busy` "
            "(Retry-After)", group=TUNING),
    Setting("OMLX_STORAGE_SETTLE", "15", parse_duration,
            "seconds writes under the data folder must work without a failure before a storage fault is reported "
            "recovered", group=TUNING),
    Setting("OMLX_PROMPT_CACHE_BYTES", "auto", size_or_keyword("auto", "off"),
            "each loaded model's prefix (prompt) cache cap: a size, `auto` = a tenth of the model budget, or `off`"),
    Setting("OMLX_PROMPT_CACHE_ENTRIES", "10", non_negative_int, "at most this many prompt cache entries per model"),
    Setting("OMLX_PROMPT_CACHE_DISK_BYTES", "4GB", size_or_keyword("off"),
            "each model's prompt cache disk tier under $OMLX_HOME/prompt-cache/: a size or `off`"),
    Setting("OMLX_PROMPT_CACHE_DISK_TOTAL", "auto", size_or_keyword("auto"),
            "the prompt cache disk tier's total across models: a size, or `auto` = a tenth of the free disk"),
    Setting("OMLX_DATABASE_URL", "", str,
            "a fleet's shared database (settings, pins, aliases, users, history): `postgres://user:pass@host:5432/db`; "
            "empty = SQLite in $OMLX_HOME"),
    Setting("OMLX_REDIS_URL", "", str,
            "a fleet's Redis (`redis://host:6379/0`): the live fleet, routing between hosts and the dashboards' "
            "channel layer; empty = one host"),
    Setting("OMLX_HOST_ID", "", str, "this host's name in the fleet; empty = the machine's name and the port"),
    Setting("OMLX_ADVERTISE_URL", "", str,
            "how the other hosts reach this host's API (`http://studio.local:8000`); empty = the address `serve` "
            "listens on (the machine's name when that is 0.0.0.0)"),
    Setting("OMLX_FLEET_KEY", "", str,
            "the secret every host-to-host call carries; required with OMLX_REDIS_URL (the server refuses to start "
            "without it)"),
    Setting("OMLX_FLEET_TTL", "3", parse_duration,
            "seconds a host stays in the fleet after its last publish (it publishes every third of that)",
            group=TUNING),
    Setting("OMLX_HOP_READ_TIMEOUT", "10", optional_duration,
            "seconds a request forwarded to another host of the fleet may go without a byte (before its answer or "
            "between chunks) before that host is asked at /health; one that does not answer within 2 s either is "
            "frozen: the request is tried elsewhere, or a stream ends with its error event. `off` = wait forever",
            group=TUNING),
    Setting("OMLX_MEMORY_PROBE", "real", choice("real", "fake"),
            "`fake` reads memory from $OMLX_HOME/fake_probe.json (tests only)", group=TESTING),
    Setting("OMLX_BLAS", "auto", choice("auto", "openblas", "mkl", "off"),
            "BLAS loaded before MLX on the CPU backend: `auto` = OpenBLAS, else MKL; `off` = MLX's bundled "
            "one", group=TUNING),
    Setting("OMLX_CPU_DEQUANTIZE", "auto", choice("auto", "on", "off"),
            "serve quantized models as float32 on the CPU backend: `auto` = when the float32 size fits the model "
            "budget"),
]


Size = int | Literal["auto", "off"]


@dataclass(frozen=True)
class Settings:
    """The typed values of SETTINGS; each field is its setting's name without OMLX_, lower case."""
    home: Path
    model_dirs: tuple[Path, ...]          # resolved: the default folders when OMLX_MODEL_DIRS is empty
    host: str
    port: int
    api_key: str
    allowed_hosts: tuple[str, ...]
    metrics_public: bool
    shutdown_grace: float
    header_timeout: float
    idle_timeout: float
    max_connections_per_client: int
    max_model_memory: Size
    max_loaded_models: int
    idle_ttl: float | None
    memory_ceiling: Size
    memory_guard: str
    soft_fraction: float
    hard_fraction: float
    admission_wait: float
    load_wait: float
    admission_queue: int
    max_concurrent: int
    queue_per_model: int
    key_share: float
    prefill_step: int
    prefill_step_alone: int
    draft_tokens: int
    draft_min_acceptance: float
    warmup: str
    mlx_cache_max: Size
    load_group_bytes: int
    sse_keepalive: float | None
    context_fallback: int
    prompt_chars_per_token: int
    default_max_tokens: int | None        # None: the room the prompt leaves in the context
    max_messages: int
    max_tools: int
    max_stop_length: int
    max_images: int
    max_image_bytes: int
    max_request_image_bytes: int
    max_image_pixels: int
    image_fetch: bool
    image_fetch_timeout: float
    switch_interval: float
    telemetry_days: float
    responses_days: float
    responses_max: int
    responses_bytes: int
    responses_chain_bytes: int
    traces: bool
    trace_rows: int
    trace_days: float
    db_busy_timeout: float
    storage_settle: float
    prompt_cache_bytes: Size
    prompt_cache_entries: int
    prompt_cache_disk_bytes: Size
    prompt_cache_disk_total: Size
    database_url: str
    redis_url: str
    host_id: str
    advertise_url: str
    fleet_key: str
    fleet_ttl: float
    hop_read_timeout: float | None
    memory_probe: str
    blas: str
    cpu_dequantize: str

    def with_values(self, **changes: Any) -> "Settings":
        """A copy with some values replaced (tests, benchmarks)."""
        return replace(self, **changes)

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> "Settings":
        environ = dict(os.environ if environ is None else environ)
        values = {attr_name(s.name): _parsed(s, environ.get(s.name, s.default)) for s in SETTINGS}
        values["model_dirs"] = tuple(values["model_dirs"]) or _default_model_dirs(values["home"])
        values["allowed_hosts"] = tuple(values["allowed_hosts"])
        values["host_id"] = values["host_id"] or f"{socket.gethostname()}:{values['port']}"
        advertise = values["advertise_url"] or _default_advertise(values["host"], values["port"])
        values["advertise_url"] = advertise.rstrip("/")
        return cls(**values)

    @property
    def fleet(self) -> bool:
        """Several hosts: a Redis to meet in (OMLX_REDIS_URL)."""
        return bool(self.redis_url)



class ImproperlyConfigured(ValueError):
    pass


def attr_name(name: str) -> str:
    return name.removeprefix("OMLX_").lower()


def _parsed(setting: Setting, raw: str) -> Any:
    try:
        return setting.parse(raw)
    except ValueError as e:
        raise ImproperlyConfigured(f"{setting.name}={raw!r}: {e}") from e


def _default_model_dirs(home: Path) -> tuple[Path, ...]:
    cache = _hf_cache()
    return (home / "models", cache) if cache.is_dir() else (home / "models",)


def _default_advertise(host: str, port: int) -> str:
    """Where the other hosts reach this one: loopback when it listens there, the machine's name when it
    listens everywhere, else the address it listens on."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return f"http://127.0.0.1:{port}"
    if host in ("0.0.0.0", "::", ""):
        return f"http://{socket.gethostname()}:{port}"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def setting_fields() -> set[str]:
    return {f.name for f in fields(Settings)}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings.from_environ()


def read_setting(name: str) -> Any:
    """One setting parsed from the environment now, uncached (for code that runs before Django)."""
    setting = next(s for s in SETTINGS if s.name == name)
    return _parsed(setting, os.environ.get(setting.name, setting.default))


def reload_settings() -> Settings:
    get_settings.cache_clear()
    return get_settings()
