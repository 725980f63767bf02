"""python manage.py make_fixture_model OUT_DIR_OR_NAME --size-mb N [--bits 4|8] [--seed S] [--tokenizer-from DIR]"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from pool.catalog.gguf import folder_size
from pool.conf import get_settings
from pool.management.client import announce_new_models


class Command(BaseCommand):
    # Checks import the URLconf (views, the pool, MLX): too slow for prepare_demo's no-op path,
    # and nothing here depends on them.
    requires_system_checks = []
    help = "Build a random-weight float32 llama model folder of about N MB, optionally 4- or 8-bit (tests, benchmarks)."

    def add_arguments(self, parser):
        parser.add_argument("target", metavar="OUT_DIR_OR_NAME",
                            help="a folder path, or a bare name meaning $OMLX_HOME/models/<name>")
        parser.add_argument("--size-mb", type=float, required=True, help="target weight size in MB (10**6 bytes)")
        parser.add_argument("--bits", type=int, choices=(4, 8),
                            help="quantize every linear layer and the embedding (affine, group size 64)")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--tokenizer-from", type=Path,
                            help="model folder whose tokenizer is copied (default: the demo model)")

    def handle(self, *args, target, size_mb, seed=0, tokenizer_from=None, bits=None, **options):
        from pool.catalog.fixture_models import make_fixture_model

        home = get_settings().home
        out_dir = Path(target).expanduser() if "/" in target or target.startswith(".") else home / "models" / target
        tokenizer_from = tokenizer_from or home / "models" / "smollm2-135m-instruct"
        try:
            cfg = make_fixture_model(out_dir, size_mb, tokenizer_from=tokenizer_from, seed=seed, bits=bits)
        except (FileNotFoundError, ValueError) as e:
            raise CommandError(str(e)) from e
        shape = ", ".join(f"{k}={cfg[k]}" for k in ("hidden_size", "intermediate_size", "num_hidden_layers"))
        self.stdout.write(f"{out_dir} ({folder_size(out_dir) / 1e6:.1f} MB; {shape})")
        if (line := announce_new_models()) is not None:
            self.stdout.write(line)
