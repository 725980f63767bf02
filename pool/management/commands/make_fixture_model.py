"""python manage.py make_fixture_model OUT_DIR_OR_NAME [--arch A] [--size-mb N] [--dtype D] [--bits 4|8] [--seed S]
[--tokenizer-from DIR]"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from pool.catalog.fixture_archs import ARCHS
from pool.catalog.fixture_vlms import VISION_ARCHS
from pool.catalog.gguf import folder_size
from pool.conf import get_settings
from pool.management.client import announce_new_models


class Command(BaseCommand):
    # Checks import the URLconf (views, the pool, MLX): too slow for prepare_demo's no-op path,
    # and nothing here depends on them.
    requires_system_checks = []
    help = ("Build a random-weight model folder of one architecture mlx-lm runs (llama, qwen3_5, gemma3, gpt_oss, "
            "deepseek_v3, ...) of about N MB, optionally 4- or 8-bit (tests, benchmarks).")

    def add_arguments(self, parser):
        parser.add_argument("target", metavar="OUT_DIR_OR_NAME",
                            help="a folder path, or a bare name meaning $OMLX_HOME/models/<name>")
        parser.add_argument("--arch", choices=[*ARCHS, *VISION_ARCHS], default="llama",
                            help="the architecture: mlx-lm's own model class for it builds the weights")
        parser.add_argument("--size-mb", type=float,
                            help="target weight size in MB (10**6 bytes); default: the tiny shape the tests use")
        parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
        parser.add_argument("--bits", type=int, choices=(4, 8),
                            help="quantize every linear layer and the embedding (affine, group size 64)")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--tokenizer-from", type=Path,
                            help="model folder whose tokenizer is copied (default: the demo model)")

    def handle(self, *args, target, size_mb=None, seed=0, tokenizer_from=None, bits=None, arch="llama",
               dtype="float32", **options):
        from pool.catalog.fixture_models import make_fixture_model

        home = get_settings().home
        out_dir = Path(target).expanduser() if "/" in target or target.startswith(".") else home / "models" / target
        tokenizer_from = tokenizer_from or home / "models" / "smollm2-135m-instruct"
        try:
            cfg = make_fixture_model(out_dir, size_mb, tokenizer_from=tokenizer_from, seed=seed, bits=bits,
                                     arch=arch, dtype=dtype)
        except (FileNotFoundError, ValueError) as e:
            raise CommandError(str(e)) from e
        text = cfg.get("text_config") or cfg      # a VLM-shaped checkpoint nests its text model's fields
        shape = ", ".join(f"{k}={text[k]}" for k in ("hidden_size", "intermediate_size", "num_hidden_layers"))
        shape = f"{cfg['model_type']}: {shape}"
        self.stdout.write(f"{out_dir} ({folder_size(out_dir) / 1e6:.1f} MB; {shape})")
        if (line := announce_new_models()) is not None:
            self.stdout.write(line)
