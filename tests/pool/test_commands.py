"""`models`, `pin`, `unpin` and `import_omlx_settings`: in-process against the test database and
model folders in a tmp dir, and as subprocesses against a real running server."""

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from pool.management.commands.models import format_seconds, format_size
from pool.models import ModelSettings
from tests.conftest import DEMO, ROOT
from tests.pool.conftest import make_folder

STAND_IN_DEMO = True   # shapes, errors and faults, not answers: tests/conftest.py demo_folder


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def table(output: str) -> dict[str, dict[str, str]]:
    """Rows of the `models` table by id, cut at the header's column starts."""
    lines = [line for line in output.splitlines() if line and not line.startswith(("(", "*"))]
    header = lines[0]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    bounds = list(zip(starts, [*starts[1:], None]))
    rows = {}
    for line in lines[1:]:
        cells = {header[a:b].strip(): line[a:b].strip() for a, b in bounds}
        rows[cells["ID"]] = {k: v for k, v in cells.items() if v or k in ("ALIAS", "TTL")}
    return rows


# ---- formatting --------------------------------------------------------------------------------

@pytest.mark.parametrize("n, text", [
    (None, "-"), (0, "0 B"), (999, "999 B"), (1_000, "1.0 KB"), (2_500_000, "2.5 MB"),
    (269_079_552, "269.1 MB"), (7_650_000_000, "7.7 GB"), (1_200_000_000_000, "1.2 TB"),
])
def test_format_size_is_decimal(n, text):
    assert format_size(n) == text


@pytest.mark.parametrize("seconds, text", [(None, ""), (90, "90s"), (600, "10m"), (300.0, "5m"), (7200, "2h")])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


# ---- models ------------------------------------------------------------------------------------

def test_models_without_a_server_lists_disk_and_database(models_dir):
    make_folder(models_dir, "alpha", 2_500_000)
    make_folder(models_dir / "org", "beta", 1_200_000_000)  # organised layout: id is the folder name
    ModelSettings.objects.create(model_id="beta", is_pinned=True)

    out = run("models")
    rows = table(out)
    assert list(rows) == ["alpha", "beta"]
    assert rows["alpha"] == {"ID": "alpha", "STATE": "unloaded", "SIZE": "2.5 MB", "PINNED": "no"}
    assert rows["beta"] == {"ID": "beta", "STATE": "unloaded", "SIZE": "1.2 GB", "PINNED": "yes"}
    assert "ALIAS" not in out and "TTL" not in out  # only shown when some model has one
    assert "(server not running at http://127.0.0.1:" in out.splitlines()[-1]


def test_models_shows_alias_ttl_and_settings_without_a_folder(models_dir):
    make_folder(models_dir, "alpha", 1_000)
    ModelSettings.objects.create(model_id="alpha", alias="a", ttl_seconds=600)
    ModelSettings.objects.create(model_id="gone", is_pinned=True)

    rows = table(run("models"))
    assert rows["alpha"] == {"ID": "alpha", "STATE": "unloaded", "SIZE": "1.0 KB", "PINNED": "no", "ALIAS": "a",
                             "TTL": "10m"}
    assert rows["gone"]["STATE"] == "missing" and rows["gone"]["PINNED"] == "yes"


def test_models_with_no_models(models_dir):
    out = run("models")
    assert f"no models found in {models_dir}" in out
    assert "(server not running" in out


# ---- pin / unpin -------------------------------------------------------------------------------

def test_pin_and_unpin_persist(models_dir):
    make_folder(models_dir, "alpha")

    out = run("pin", "alpha")
    assert "alpha: pinned in the database" in out
    assert "server not running" in out
    assert ModelSettings.objects.get(model_id="alpha").is_pinned
    assert "alpha: already pinned" in run("pin", "alpha")
    assert table(run("models"))["alpha"]["PINNED"] == "yes"

    assert "alpha: unpinned in the database" in run("unpin", "alpha")
    assert not ModelSettings.objects.get(model_id="alpha").is_pinned
    assert table(run("models"))["alpha"]["PINNED"] == "no"


def test_unpin_without_a_row_writes_nothing(models_dir):
    make_folder(models_dir, "alpha")
    assert "alpha: already unpinned" in run("unpin", "alpha")
    assert not ModelSettings.objects.exists()


def test_pin_by_alias(models_dir):
    make_folder(models_dir, "Qwen3-8B-4bit")
    ModelSettings.objects.create(model_id="Qwen3-8B-4bit", alias="qwen")

    assert "Qwen3-8B-4bit (alias 'qwen'): pinned" in run("pin", "qwen")
    assert ModelSettings.objects.get(model_id="Qwen3-8B-4bit").is_pinned
    assert ModelSettings.objects.count() == 1
    run("unpin", "QWEN")  # names resolve case-insensitively, as in requests
    assert not ModelSettings.objects.get(model_id="Qwen3-8B-4bit").is_pinned


def test_pin_a_model_known_only_to_the_database(models_dir):
    ModelSettings.objects.create(model_id="elsewhere")
    run("pin", "elsewhere")
    assert ModelSettings.objects.get(model_id="elsewhere").is_pinned


def test_pin_unknown_model_lists_the_available_ones(models_dir):
    make_folder(models_dir, "alpha")
    make_folder(models_dir, "beta")
    ModelSettings.objects.create(model_id="gamma")
    with pytest.raises(CommandError, match=r"unknown model 'nope'. Available models: alpha, beta, gamma"):
        run("pin", "nope")
    assert not ModelSettings.objects.filter(model_id="nope").exists()


# ---- import_omlx_settings ----------------------------------------------------------------------

OMLX_FILE = {
    "version": 1,
    "models": {
        "Qwen3-8B-4bit": {
            "is_pinned": True, "ttl_seconds": 1800, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
            "max_tokens": 4096, "model_alias": "qwen", "display_name": "Qwen3 8B", "is_default": True,
            "enable_thinking": False, "chat_template_kwargs": {"enable_thinking": False},
        },
        "gemma-3-4b-it-4bit": {"ttl_seconds": 300, "is_hidden": True, "is_favorite": True},
        "Llama-3.2-1B-Instruct-4bit": {"temperature": 0, "model_alias": "llama", "trust_remote_code": False},
    },
}


@pytest.fixture
def omlx_file(models_dir, tmp_path):
    for name in ("Qwen3-8B-4bit", "gemma-3-4b-it-4bit"):
        make_folder(models_dir, name)
    path = tmp_path / "model_settings.json"
    path.write_text(json.dumps(OMLX_FILE, indent=2))
    return path


def test_import_omlx_settings(omlx_file):
    ModelSettings.objects.create(model_id="gemma-3-4b-it-4bit", notes="kept", ttl_seconds=60)

    out = run("import_omlx_settings", str(omlx_file))
    lines = out.splitlines()
    assert lines[0].startswith("Qwen3-8B-4bit: created (is_pinned=True, ttl_seconds=1800, temperature=0.6, "
                               "top_p=0.95, max_tokens=4096, alias='qwen', display_name='Qwen3 8B'); "
                               "skipped: chat_template_kwargs, enable_thinking, is_default, top_k")
    assert lines[1] == "gemma-3-4b-it-4bit: updated (ttl_seconds=300, is_hidden=True); skipped: is_favorite"
    assert lines[2] == ("Llama-3.2-1B-Instruct-4bit: created (temperature=0, alias='llama'); "
                        "skipped: trust_remote_code; not in the model folders")
    assert lines[3] == "3 models: 2 created, 1 updated, 0 unchanged"

    qwen = ModelSettings.objects.get(model_id="Qwen3-8B-4bit")
    assert (qwen.is_pinned, qwen.ttl_seconds, qwen.temperature, qwen.top_p, qwen.max_tokens, qwen.alias,
            qwen.display_name, qwen.is_hidden) == (True, 1800, 0.6, 0.95, 4096, "qwen", "Qwen3 8B", False)
    gemma = ModelSettings.objects.get(model_id="gemma-3-4b-it-4bit")
    assert (gemma.ttl_seconds, gemma.is_hidden, gemma.notes) == (300, True, "kept")  # absent fields are kept
    assert ModelSettings.objects.get(model_id="Llama-3.2-1B-Instruct-4bit").alias == "llama"

    again = run("import_omlx_settings", str(omlx_file))  # idempotent
    assert "3 models: 0 created, 0 updated, 3 unchanged" in again
    assert ModelSettings.objects.count() == 3

    rows = table(run("models"))
    assert rows["Qwen3-8B-4bit"]["PINNED"] == "yes" and rows["Qwen3-8B-4bit"]["ALIAS"] == "qwen"
    assert rows["Qwen3-8B-4bit"]["TTL"] == "30m"
    assert rows["Llama-3.2-1B-Instruct-4bit"]["STATE"] == "missing"
    assert "pinned" in run("unpin", "qwen")  # imported aliases resolve


def test_import_dry_run_writes_nothing(omlx_file):
    out = run("import_omlx_settings", str(omlx_file), "--dry-run")
    assert "Qwen3-8B-4bit: would be created (is_pinned=True" in out
    assert out.splitlines()[-1] == "3 models: 3 created, 0 updated, 0 unchanged (dry run: nothing written)"
    assert not ModelSettings.objects.exists()


def test_import_moves_aliases_between_models(omlx_file, tmp_path):
    ModelSettings.objects.create(model_id="Qwen3-8B-4bit", alias="llama")
    ModelSettings.objects.create(model_id="Llama-3.2-1B-Instruct-4bit", alias="qwen")
    run("import_omlx_settings", str(omlx_file))
    assert ModelSettings.objects.get(model_id="Qwen3-8B-4bit").alias == "qwen"
    assert ModelSettings.objects.get(model_id="Llama-3.2-1B-Instruct-4bit").alias == "llama"


def test_import_missing_file(models_dir, tmp_path):
    with pytest.raises(CommandError, match="no such file"):
        run("import_omlx_settings", str(tmp_path / "model_settings.json"))


@pytest.mark.parametrize("text, message", [
    ('{"version": 1, "models": {', "not valid JSON"),
    ("[]", "expected"),
    ('{"version": 1}', "expected"),
    ('{"version": 1, "models": {"a": 3}}', "the settings of 'a' must be an object"),
])
def test_import_bad_file(models_dir, tmp_path, text, message):
    path = tmp_path / "model_settings.json"
    path.write_text(text)
    with pytest.raises(CommandError, match=message):
        run("import_omlx_settings", str(path))
    assert not ModelSettings.objects.exists()


@pytest.mark.parametrize("models, message", [
    ({"a": {"temperature": 5}, "b": {"is_pinned": True}}, "a: 'temperature' must be between 0 and 2"),
    ({"a": {"ttl_seconds": -1}}, "a: 'ttl_seconds' must be a non-negative integer"),
    ({"a": {"is_pinned": "yes"}}, "a: 'is_pinned' must be true or false"),
    ({"a": {"model_alias": "x"}, "b": {"model_alias": "x"}}, "b: the alias 'x' is already used by 'a'"),
    ({"a": {"model_alias": "b"}, "b": {}}, "a: the alias 'b' is the id of another model"),
])
def test_import_invalid_values_import_nothing(models_dir, tmp_path, models, message):
    path = tmp_path / "model_settings.json"
    path.write_text(json.dumps({"version": 1, "models": models}))
    with pytest.raises(CommandError, match="nothing imported") as e:
        run("import_omlx_settings", str(path))
    assert message in str(e.value)
    assert not ModelSettings.objects.exists()


def test_import_alias_taken_by_an_existing_row(omlx_file):
    ModelSettings.objects.create(model_id="other", alias="qwen")
    with pytest.raises(CommandError, match="Qwen3-8B-4bit: the alias 'qwen' is already used by 'other'"):
        run("import_omlx_settings", str(omlx_file))
    assert ModelSettings.objects.count() == 1


# ---- against a running server ------------------------------------------------------------------

def manage(server, *args, **env) -> subprocess.CompletedProcess:
    full_env = {**server.env, "OMLX_PORT": str(server.port), **env}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=60)


def test_pin_reaches_the_running_pool_and_models_shows_live_state(start_server):
    server = start_server(OMLX_API_KEY="sekret")  # the commands send the Bearer key
    assert server.model(DEMO)["pinned"] is False

    done = manage(server, "pin", DEMO)
    assert done.returncode == 0, done.stderr
    assert f"{DEMO}: pinned in the database" in done.stdout
    assert f"the running server at http://127.0.0.1:{server.port} applied it at once" in done.stdout
    assert server.model(DEMO)["pinned"] is True  # at once: no restart, no polling

    assert server.post(f"/api/models/{DEMO}/load", {}).status_code == 200
    listing = manage(server, "models")
    assert listing.returncode == 0, listing.stderr
    row = table(listing.stdout)[DEMO]
    assert (row["STATE"], row["PINNED"]) == ("loaded", "yes")  # only the server knows "loaded"
    assert float(row["SIZE"].split()[0]) > 0
    assert f"(live state from the server at http://127.0.0.1:{server.port})" in listing.stdout

    done = manage(server, "unpin", DEMO)
    assert done.returncode == 0, done.stderr
    assert server.model(DEMO)["pinned"] is False
    assert table(manage(server, "models").stdout)[DEMO]["PINNED"] == "no"

    # A wrong key: the table falls back to disk and says why; pin fails loudly.
    listing = manage(server, "models", OMLX_API_KEY="wrong")
    assert table(listing.stdout)[DEMO]["STATE"] == "unloaded"
    assert "answered 401" in listing.stdout
    done = manage(server, "pin", DEMO, OMLX_API_KEY="wrong")
    assert done.returncode == 1 and "answered 401" in done.stderr
    assert server.model(DEMO)["pinned"] is False


def test_import_reaches_the_running_pool(start_server, tmp_path):
    server = start_server()
    path = tmp_path / "model_settings.json"
    path.write_text(json.dumps({"version": 1, "models": {DEMO: {"is_pinned": True, "ttl_seconds": 900,
                                                                "model_alias": "smol"}}}))
    done = manage(server, "import_omlx_settings", str(path))
    assert done.returncode == 0, done.stderr
    assert "applied to the running server" in done.stdout
    model = server.model(DEMO)
    assert model["pinned"] is True and model["ttl_seconds"] == 900 and model["alias"] == "smol"


def test_a_new_model_appears_in_the_running_server(start_server):
    server = start_server()
    done = manage(server, "make_fixture_model", "fresh", "--size-mb", "5",
                  "--tokenizer-from", str(server.home / "models" / DEMO))
    assert done.returncode == 0, done.stderr
    assert "lists it now" in done.stdout
    assert server.model("fresh")["state"] == "unloaded"
    assert server.post("/v1/completions", {"model": "fresh", "prompt": "x", "max_tokens": 2}).status_code == 200
