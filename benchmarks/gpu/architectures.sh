#!/usr/bin/env bash
# Issue 32 on a CUDA machine (the `device` tool's H100/H200), after setup.sh: random-weight bf16
# models of about 2 GB of a hybrid (qwen3_5: linear-attention state beside full attention) and a
# sliding-window (gemma3, its text model nested in text_config) architecture, built here with the
# demo model's tokenizer files (TOKENIZER, a folder). multiturn: multiturn.py (a ~1,500-token history,
# 5 turns, every side warmed) against mlx_lm.server; long: the first turn of a 16K-token prompt,
# single_stream.py against mlx_lm.server and raw mlx-lm. ARCHS picks the architectures (default
# "qwen3_5 gemma3"), ROUNDS multiturn's rounds (2), RUNS the long prompt's runs (2); each benchmark
# stops at DEADLINE seconds (500), or earlier where END (a time in `date +%s` seconds) comes first, and
# what it printed comes back. TIER_OFF=no leaves multiturn's omlx-site without its disk tier out.
#     bash benchmarks/gpu/architectures.sh TOKENIZER_FOLDER [multiturn] [long]
set -uo pipefail
tokenizer=$(realpath "$1"); shift
wanted=" ${*:-multiturn long} "
want() { [[ "$wanted" == *" $1 "* ]]; }
source "$(dirname "$0")/common.sh"
export MLX_PTX_CACHE_DIR=/tmp/kernels/ptx CUDA_CACHE_PATH=/tmp/kernels/cuda CUDA_CACHE_MAXSIZE=2147483648
python3 -c 'import mlx.core as mx; print(mx.default_device(), mx.device_info().get("device_name"))'
for arch in ${ARCHS:-qwen3_5 gemma3}; do
  model=/tmp/models/$arch-2g-bf16
  [ -f "$model/config.json" ] || python3 -c "
from pool.catalog.fixture_models import make_fixture_model
make_fixture_model('$model', 2000, tokenizer_from='$tokenizer', dtype='bfloat16', seed=1, arch='$arch')" 2>&1 | grep -v Quantized
  du -sh "$model"
  (cd benchmarks
   ! want multiturn || timeout "$(limit)" python3 multiturn.py ${TIER_OFF:+--no-tier-off} --model "$model" --history-tokens 1500 --turns 5 \
     --rounds "${ROUNDS:-2}" 2>&1 | tee "$out/multiturn-$arch.txt"
   ! want long || timeout "$(limit)" python3 single_stream.py --model "$model" --tokens 16 --runs "${RUNS:-2}" \
     --prompt-tokens 16000 2>&1 | tee "$out/long-$arch.txt")
done
