"""python manage.py make_fixture_adapter BASE ADAPTER_NAME [--rank R] [--layers N] [--strength S] [--seed S] [--dora]"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from pool.conf import get_settings
from pool.management.client import announce_new_models


class Command(BaseCommand):
    requires_system_checks = []
    help = ("Build a random-weight LoRA (or DoRA) adapter over a model folder with mlx-lm's own LoRA layers, "
            "served as the model BASE:ADAPTER_NAME (tests, benchmarks).")

    def add_arguments(self, parser):
        parser.add_argument("base", help="the base model: a folder path, or a name in $OMLX_HOME/models")
        parser.add_argument("name", help="the adapter's name: its folder is $OMLX_HOME/models/<name>")
        parser.add_argument("--rank", type=int, default=8)
        parser.add_argument("--layers", type=int, default=4, help="how many of the last layers get LoRA layers")
        parser.add_argument("--strength", type=float, default=0.05,
                            help="the random lora_b's scale: 0 leaves the base's answers as they were")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--dora", action="store_true", help="DoRA layers instead of LoRA")

    def handle(self, *args, base, name, rank=8, layers=4, strength=0.05, seed=0, dora=False, **options):
        from pool.catalog.fixture_adapters import make_fixture_adapter

        models = get_settings().home / "models"
        base_dir = Path(base).expanduser() if "/" in base or base.startswith(".") else models / base
        if not (base_dir / "config.json").is_file():
            raise CommandError(f"no model folder at {base_dir}")
        out_dir = models / name
        if out_dir.exists():
            raise CommandError(f"{out_dir} already exists")
        make_fixture_adapter(out_dir, base_dir, rank=rank, layers=layers, strength=strength, seed=seed, dora=dora)
        self.stdout.write(f"{out_dir}: served as {base_dir.name}:{name}")
        if (line := announce_new_models()) is not None:
            self.stdout.write(line)
