#!/usr/bin/env bash
# OMLX_LOAD_GROUP_BYTES on the CUDA machine: for each group size, isolation.py (model A's inter-token
# gaps while B loads) and swap.py (evict A, load B) against the same server settings. Run after
# setup.sh; builds speed.sh's two models first.
#     bash benchmarks/gpu/load_groups.sh TOKENIZER_FOLDER [SIZES...]   (default: 16MiB 64MiB 256MiB)
set -euo pipefail
tokenizer=$1; shift
bash benchmarks/gpu/speed.sh "$tokenizer" none >/dev/null
source "$(dirname "$0")/common.sh"
cd benchmarks
for size in "${@:-16MiB 64MiB 256MiB}"; do
  for one in $size; do
    echo "== OMLX_LOAD_GROUP_BYTES=$one"
    OMLX_BENCH_ENV="OMLX_LOAD_GROUP_BYTES=$one" python3 isolation.py --model /tmp/models/llama-1500m-q4 \
      --model-b /tmp/models/llama-2g-bf16 --stream-tokens 256 --long-tokens 400 --rounds "${ROUNDS:-2}" 2>&1 \
      | grep -v "^INFO" | tee "$out/isolation-$one.txt" | sed -n '3,4p'
    OMLX_BENCH_ENV="OMLX_LOAD_GROUP_BYTES=$one" python3 swap.py --model-a /tmp/models/llama-1500m-q4 \
      --model-b /tmp/models/llama-2g-bf16 2>&1 | grep -v "^INFO" | tee "$out/swap-$one.txt" | tail -3
  done
done
