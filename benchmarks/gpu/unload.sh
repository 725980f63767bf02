#!/usr/bin/env bash
# Issue 22 on the CUDA machine (after setup.sh): does an unload give the memory back, and what does a
# model's first request after its load cost, with and without the warm-up (benchmarks/unload.py).
#     bash benchmarks/gpu/unload.sh TOKENIZER_FOLDER [unload] [first]
# unload: a 20 GB bf16 random llama (UNLOAD_MB) as four model ids (hard links) under a 50 GB budget,
#   chats A B C D A B, the two left unloaded by hand, an enforcer tick; then three ids with the release
#   order before the fix (--old-order). first: the 1.5 GB 4-bit llama of speed.sh, 8 streams, each run
#   a fresh process with its own OMLX_HOME (its kernel cache): warm-up off; on (waited for); on with the
#   requests sent at once; off again over the kept kernel cache of the second run (a restart).
# Each python run has its own deadline; results are RESULT lines in $OUT/*.txt.
set -uo pipefail
tokenizer=$(realpath "$1"); shift
wanted=" ${*:-unload first} "
want() { [[ "$wanted" == *" $1 "* ]]; }
source "$(dirname "$0")/common.sh"
big=/tmp/models/llama-${UNLOAD_MB:-20000}m-bf16
q4=/tmp/models/llama-1500m-q4
if want unload; then
  s=$SECONDS; build "$big" "${UNLOAD_MB:-20000}" 5; echo "built $big in $((SECONDS - s)) s"; du -sh "$big"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv
  timeout "${UNLOAD_S:-250}" python3 benchmarks/unload.py unload --model "$big" --budget 50GB \
    --deadline $(( ${UNLOAD_S:-250} - 20 )) 2>&1 | grep -v '^INFO' | tee "$out/unload.txt"
  timeout "${OLD_S:-120}" python3 benchmarks/unload.py unload --model "$big" --budget 50GB --copies 3 --old-order \
    --work /tmp/unload-old --deadline $(( ${OLD_S:-120} - 15 )) 2>&1 | grep -v '^INFO' | tee "$out/unload-old.txt"
fi
if want first; then
  build "$q4" 1500 2 4
  # each run: warm-up, OMLX_HOME under /tmp (a home used again keeps its kernels: a restart), more options
  for run in ${FIRST_RUNS:-off:h-off on:h-on on:h-nowait:--no-wait off:h-on}; do
    IFS=: read -r warm home extra <<<"$run"
    s=$SECONDS
    OMLX_HOME=/tmp/$home timeout "${FIRST_S:-100}" python3 benchmarks/unload.py first --model "$q4" --warmup "$warm" \
      --work "/tmp/$home-work" --deadline $(( ${FIRST_S:-100} - 10 )) $extra 2>&1 | grep -v '^INFO' | tee -a "$out/first.txt"
    echo "run $run: $((SECONDS - s)) s; kernels kept: $(du -sh /tmp/$home/kernels 2>/dev/null | cut -f1)"
  done
fi
