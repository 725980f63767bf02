"""The model folders drafts.py compares: a random-weight bf16 llama as the target and its drafts.

A random target has no smaller model trained to agree with it, so the agreeing draft is made so: the
target's layers past the first KEEP add only a little to the residual stream (their o_proj and
down_proj scaled by QUIET; their weights keep their sizes, so a step reads and computes what any
model of this shape does), and the draft is the target cut to those first KEEP layers (its own
embedding, norm and head). It proposes what the target would choose, as a well-trained small draft
does, at a fraction of a target step's work: on a GPU, where a step costs about the kernels it
launches, a draft of KEEP of the target's layers is about KEEP / layers of its step.

The other drafts: quantized copies of the target by `mlx_lm convert` (issue 36's example; on a GPU
their steps launch as many kernels as the target's, so they cannot pay there), and a tiny unrelated
random llama of the same vocabulary (it does not agree: the never-slower case)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from _models import CACHE

SEED = 36
GROUP = 64        # mlx-lm's quantization group: widths that are not multiples stay dense
KEEP = 2          # the layers the shallow draft keeps
QUIET = 0.03      # what the target's deeper layers' output projections are scaled by


def say(text: str = "") -> None:
    print(text, flush=True)


def aligned_mb(mb: float, vocab: int) -> float:
    """The size nearest `mb` whose planned hidden and feed-forward widths are multiples of GROUP."""
    from pool.catalog.fixture_models import plan

    for step in range(4000):
        for size in (mb + step * 0.05, mb - step * 0.05):
            shape = plan(size * 1e6, vocab, 2)
            if shape["hidden_size"] % GROUP == 0 and shape["intermediate_size"] % GROUP == 0:
                return round(size, 2)
    return mb


def folders(mb: float, tokenizer: Path, bits: list[int]) -> tuple[Path, dict[str, Path]]:
    """(target, {label: draft folder}), built once in the benchmark cache."""
    from tokenizers import Tokenizer

    from pool.catalog.fixture_models import make_fixture_model

    vocab = Tokenizer.from_file(str(tokenizer / "tokenizer.json")).get_vocab_size()
    size = aligned_mb(mb, vocab)
    target = CACHE / "drafts" / f"llama-{size:g}mb-bf16-s{SEED}-quiet{KEEP}"
    if not (target / "config.json").exists():
        say(f"building the target {target.name} ({size:g} MB bf16; layers past {KEEP} scaled by {QUIET})")
        loud = target.with_name(target.name + ".loud")
        make_fixture_model(loud, size, tokenizer_from=tokenizer, seed=SEED, dtype="bfloat16")
        rewrite(loud, target, lambda key, w: w * QUIET if deep(key) and quieted(key) else w)
        shutil.rmtree(loud)
    drafts = {f"shallow copy ({KEEP} layers)": shallow_copy(target)}
    drafts.update({f"{b}-bit copy": quantized_copy(target, b) for b in bits})
    unrelated = CACHE / "drafts" / f"llama-tiny-bf16-s{SEED + 1}"
    if not (unrelated / "config.json").exists():
        make_fixture_model(unrelated, None, tokenizer_from=tokenizer, seed=SEED + 1, dtype="bfloat16")
    drafts["unrelated draft"] = unrelated
    return target, drafts


def layer(key: str) -> int | None:
    parts = key.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None


def deep(key: str) -> bool:
    return (layer(key) or 0) >= KEEP


def quieted(key: str) -> bool:
    return key.endswith(("o_proj.weight", "down_proj.weight"))


def rewrite(src: Path, out: Path, change, config: dict | None = None) -> None:
    """Copy a model folder, every weight through change(key, array) (None drops it), and the config
    updated with `config`; written beside and renamed into place."""
    import mlx.core as mx

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(src, partial, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    weights = {}
    for file in sorted(src.glob("*.safetensors")):
        for key, w in mx.load(str(file)).items():
            changed = change(key, w)
            if changed is not None:
                weights[key] = changed.astype(w.dtype)
    mx.save_safetensors(str(partial / "model.safetensors"), weights, metadata={"format": "mlx"})
    settings = json.loads((src / "config.json").read_text())
    (partial / "config.json").write_text(json.dumps({**settings, **(config or {})}, indent=2))
    partial.rename(out)


def shallow_copy(target: Path) -> Path:
    out = target.with_name(f"{target.name}-first{KEEP}")
    if not (out / "config.json").exists():
        say(f"cutting {target.name} to its first {KEEP} layers")
        rewrite(target, out, lambda key, w: None if deep(key) else w, {"num_hidden_layers": KEEP})
    return out


def quantized_copy(target: Path, bits: int) -> Path:
    out = target.with_name(f"{target.name}-q{bits}")
    if not (out / "config.json").exists():
        say(f"quantizing {target.name} to {bits} bits (mlx_lm convert)")
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(target), "--mlx-path",
                        str(partial), "-q", "--q-bits", str(bits), "--q-group-size", str(GROUP)],
                       check=True, stdout=subprocess.DEVNULL)
        partial.rename(out)
    return out


def megabytes(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 1e6
