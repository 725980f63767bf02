#!/usr/bin/env bash
# Issue 36 on a CUDA machine (the `device` tool's H100/H200), after setup.sh: drafts.py (a ~2 GB bf16
# random llama with the demo model's tokenizer files, TOKENIZER a folder; its 4-bit copy as the agreeing
# draft and a tiny unrelated one; omlx-site, mlx_lm.server --draft-model and raw mlx-lm side by side) and
# adapters.py (16 LoRA adapters over a ~2 GB bf16 llama: memory, switching, 4 adapters' throughput against
# the base's). Each stops at DEADLINE seconds (500), or earlier where END (a `date +%s` time) comes first;
# what it printed comes back. Fixtures go under /tmp/bench-cache (OMLX_BENCH_CACHE). GROUPS picks drafts.py's
# groups (omlx,mlx_lm,raw); THROUGHPUT_ONLY=1 runs adapters.py's table 3 alone.
#     bash benchmarks/gpu/issue36.sh TOKENIZER_FOLDER [drafts] [adapters]
set -uo pipefail
tokenizer=$(realpath "$1"); shift
wanted=" ${*:-drafts adapters} "
want() { [[ "$wanted" == *" $1 "* ]]; }
source "$(dirname "$0")/common.sh"
export MLX_PTX_CACHE_DIR=/tmp/kernels/ptx CUDA_CACHE_PATH=/tmp/kernels/cuda CUDA_CACHE_MAXSIZE=2147483648
export OMLX_BENCH_CACHE=/tmp/bench-cache
python3 -c 'import mlx.core as mx; print(mx.default_device(), mx.device_info().get("device_name"))'
bf16=/tmp/models/llama-2g-bf16
cd benchmarks
! want drafts || timeout "$(limit)" python3 drafts.py --target-mb 2000 --tokenizer "$tokenizer" --tokens 128 \
  --runs "${RUNS:-3}" --groups "${GROUPS:-omlx,mlx_lm,raw}" 2>&1 | tee "$out/drafts.txt"
if want adapters; then
  (cd .. && build "$bf16" 2000 1)
  timeout "$(limit)" python3 adapters.py --model "$bf16" --rounds "${RUNS:-3}" --fused 2 ${THROUGHPUT_ONLY:+--throughput-only} 2>&1 | tee "$out/adapters.txt"
fi
