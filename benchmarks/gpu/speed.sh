#!/usr/bin/env bash
# The serving-speed benchmarks on a CUDA machine (the `device` tool's H200): mlx's CUDA wheel and the
# server's other wheels already installed under /tmp/site; two random-weight llamas built here with
# the demo model's tokenizer files (TOKENIZER, a folder): about 2 GB in bf16 and about 1.5 GB 4-bit
# (every linear layer and the embedding quantized, group size 64). Names after the folder pick
# some of the benchmarks (a device command runs at most 10 minutes): single engine cold concurrency
# multiturn isolation swap. engine: engine_ttft.py, the engine's TTFT in-process against raw; cold:
# single_stream.py on a fresh 1,564-token story (multiturn's first turn) beside an omlx-site whose
# lone request reads 512-token steps, the step before issue 22. MODELS="bf16 q4" picks the models of
# single, engine, cold and concurrency, LEVELS (default 1,4,8,16,32) the concurrency levels, RUNS
# (default 6) the runs of single, engine and cold. Every process shares one kernel cache under
# /tmp/kernels (MLX_PTX_CACHE_DIR, CUDA_CACHE_PATH), which the next call on a warm machine reuses.
#     bash benchmarks/gpu/speed.sh TOKENIZER_FOLDER [single] [engine] [cold] [concurrency] [multiturn] [isolation] [swap]
set -uo pipefail   # one benchmark failing does not stop the others
tokenizer=$(realpath "$1"); shift
wanted=" ${*:-single concurrency isolation swap} "
want() { [[ "$wanted" == *" $1 "* ]]; }
source "$(dirname "$0")/common.sh"
export MLX_PTX_CACHE_DIR=/tmp/kernels/ptx CUDA_CACHE_PATH=/tmp/kernels/cuda CUDA_CACHE_MAXSIZE=2147483648
bf16=/tmp/models/llama-2g-bf16
q4=/tmp/models/llama-1500m-q4
python3 -c 'import mlx.core as mx; print(mx.default_device(), mx.device_info())'
build "$bf16" 2000 1
if [[ " ${MODELS:-q4} " == *" q4 "* ]] || want isolation || want swap; then build "$q4" 1500 2 4; fi
du -sh "$bf16" "$q4" 2>/dev/null
cd benchmarks
declare -A folder=([bf16]="$bf16" [q4]="$q4")
for which in ${MODELS:-bf16 q4}; do
  model=${folder[$which]:-}; [ -n "$model" ] || { echo "MODELS: no model named $which (bf16, q4)"; continue; }
  name=$(basename "$model")
  ! want single || python3 single_stream.py --model "$model" --tokens 128 --runs "${RUNS:-6}" 2>&1 \
    | tee "$out/single_stream-$name.txt"
  ! want engine || python3 engine_ttft.py --model "$model" --runs "${RUNS:-6}" 2>&1 | tee "$out/engine_ttft-$name.txt"
  ! want cold || python3 single_stream.py --model "$model" --tokens 16 --runs "${RUNS:-6}" --prompt-tokens 1564 \
    --variant alone512:OMLX_PREFILL_STEP_ALONE=512 2>&1 | tee "$out/cold_turn-$name.txt"
  ! want concurrency || python3 concurrency.py --model "$model" --levels "${LEVELS:-1,4,8,16,32}" --tokens 128 --rounds 2 2>&1 \
    | tee "$out/concurrency-$name.txt"
done
! want multiturn || python3 multiturn.py --model "$bf16" --history-tokens 1500 --turns 5 --rounds "${MULTITURN_ROUNDS:-2}" 2>&1 \
  | tee "$out/multiturn.txt"
! want isolation || python3 isolation.py --model "$q4" --model-b "$bf16" --stream-tokens 256 --long-tokens "${ISOLATION_LONG_TOKENS:-1500}" --rounds "${ISOLATION_ROUNDS:-2}" 2>&1 \
  | tee "$out/isolation.txt"
! want swap || python3 swap.py --model-a "$q4" --model-b "$bf16" 2>&1 | tee "$out/swap.txt"
