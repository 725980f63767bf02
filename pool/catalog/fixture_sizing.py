"""The shape of a random-weight fixture of a target size, for any architecture of fixture_archs.

The model is built with mlx-lm's own class for its config, lazily: MLX arrays know their shapes
before they are evaluated, so counting a shape's bytes allocates nothing. A shape's bytes are
linear in the feed-forward width and in the number of layer patterns, so three counts per width
give the depth that width needs and the feed-forward width that lands on the target."""

from __future__ import annotations

from .fixture_archs import Arch

MAX_LAYERS = 24
TINY = (64, 128)        # (hidden, intermediate) of the tiny fixtures tests use


def tiny_shape(arch: Arch) -> tuple[int, int, int]:
    """(hidden, layers, intermediate): the smallest model with the architecture's whole layer pattern
    (two layers where every layer is alike, so a test sees a cache per layer type and more than one)."""
    return TINY[0], max(2, arch.layer_step), TINY[1]


def build_model(config: dict, dtype: str):
    """mlx-lm's model for `config`, its weights random (MLX's own init, unevaluated) in `dtype`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    keep = getattr(model, "cast_predicate", None) or (lambda path: True)
    # what mlx-lm keeps in float32 at load (a state-space model's A_log) stays so
    model.apply(lambda x: x.astype(getattr(mx, dtype)) if mx.issubdtype(x.dtype, mx.floating) else x)
    float32 = {k: v.astype(mx.float32) for k, v in tree_flatten(model.parameters()) if not keep(k)}
    if float32:
        model.load_weights(list(float32.items()), strict=False)
    return model


def model_bytes(config: dict, *, dtype: str, bits: int | None = None, group_size: int = 64) -> int:
    """The bytes a model of `config` would have on disk, counted without allocating them."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import quantize_model

    model = build_model(config, dtype)
    if bits is not None:
        model, _ = quantize_model(model, dict(config), group_size, bits)
    return sum(w.nbytes for _, w in tree_flatten(model.parameters()))


def shape_for(arch: Arch, target_bytes: float, vocab: int, *, dtype: str = "float32", bits: int | None = None,
              group_size: int = 64) -> tuple[int, int, int]:
    """(hidden, layers, intermediate) of about target_bytes: the narrowest width (a multiple of 64)
    that reaches the target within MAX_LAYERS, then the feed-forward width that lands on it."""
    step = arch.layer_step
    max_patterns = max(1, MAX_LAYERS // step)

    def size(hidden: int, patterns: int, inter: int) -> int:
        return model_bytes(arch.build(hidden, patterns * step, inter, vocab), dtype=dtype, bits=bits,
                           group_size=group_size)

    def fit(hidden: int) -> tuple[int, int] | None:
        """(patterns, intermediate) landing on the target at this width, or None if it takes too many."""
        inter = 64 * max(1, round(hidden * 8 / 3 / 64))
        base, two = size(hidden, 1, inter), size(hidden, 2, inter)
        per_pattern, fixed = two - base, 2 * base - two
        patterns = max(1, round((target_bytes - fixed) / per_pattern))
        if patterns > max_patterns:
            return None
        wider = size(hidden, patterns, inter + 64)
        at = fixed + patterns * per_pattern
        per_64 = max(1, wider - at)
        inter = max(64, inter + 64 * round((target_bytes - at) / per_64))
        return patterns, inter

    hidden, found = 64, None
    while hidden <= 8192:
        found = fit(hidden)
        if found is not None:
            break
        hidden += 64 if hidden < 512 else 128
    if found is None:
        raise ValueError(f"{target_bytes / 1e6:.0f} MB is too large for a {arch.name} fixture")
    patterns, inter = found
    return hidden, patterns * step, inter
