"""Whether a quantized model is served dequantized to float32 on the CPU backend.

MLX's 4-bit matmul on x86 is its own single-threaded kernel (3.6 GFLOPS), while a float32 matmul goes
to BLAS (about 300 GFLOPS once omlx_site.blas has loaded an optimized one): SmolLM2-135M prefills about
20x faster dense, for 4.7x the memory. float16/bfloat16 never reach BLAS, hence float32.
"""

from __future__ import annotations

from .load_plan import auto_model_budget


def dequantize_budget(max_model_memory: int | str, capacity: int) -> int:
    """The size a dense model must fit in: the model budget, or the `auto` one when it is `off`
    (an unbounded pool must not turn a 4-bit 70B model into 280 GB)."""
    return int(max_model_memory) if isinstance(max_model_memory, int) else auto_model_budget(capacity)


def should_dequantize(mode: str, *, cpu_backend: bool, dense_bytes: int | None, budget: int) -> bool:
    """`on`: always on the CPU backend; `off`: never; `auto`: when the float32 size fits the budget.
    Never on Metal or CUDA, and never for a model that is not quantized (`dense_bytes` None)."""
    if not cpu_backend or dense_bytes is None or mode == "off":
        return False
    return mode == "on" or dense_bytes <= budget
