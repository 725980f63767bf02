#!/usr/bin/env bash
# Where the server's time goes on the CUDA machine: py-spy (carried as a wheel under .whl/prof) samples
# `manage.py serve` while concurrency.py runs one wave at LEVEL streams (or, with BENCH=multiturn,
# while multiturn.py runs a 1,500-token chat's 5 turns, 2 rounds: issue 32's later turns); the raw
# samples are summarised per thread into $OUT/profile-LEVEL-summary.txt (benchmarks/profile_summary.py)
# and kept gzipped in $OUT/profile-LEVEL.txt.gz.
#     [BENCH=multiturn] [SECONDS_SAMPLED=100] bash benchmarks/gpu/profile.sh MODEL_FOLDER [LEVEL]
set -uo pipefail
model=$1; level=${2:-32}
[ "${BENCH:-concurrency}" = multiturn ] && level=multiturn
source "$(dirname "$0")/common.sh"
pkill -f "manage.py serve" && sleep 2   # a server an earlier benchmark left would be the one sampled
[ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/prof/*.whl
(for _ in $(seq 120); do pid=$(pgrep -f "manage.py serve" | head -1); [ -n "$pid" ] && break; sleep 0.5; done
 sleep 5; /tmp/spy/bin/py-spy record --nonblocking -p "$pid" -r 200 -d "${SECONDS_SAMPLED:-100}" -f raw --threads -o "$out/profile-$level.txt" >/dev/null 2>&1 \
   || echo "py-spy could not sample here") &
if [ "$level" = multiturn ]; then
  (cd benchmarks && python3 multiturn.py --no-tier-off --model "$model" --history-tokens 1500 --turns 5 --rounds 2)
else
  (cd benchmarks && python3 concurrency.py --model "$model" --levels "$level" --tokens 512 --rounds 1)
fi
wait
[ -f "$out/profile-$level.txt" ] && python3 benchmarks/profile_summary.py "$out/profile-$level.txt" | tee "$out/profile-$level-summary.txt" \
  && gzip -f "$out/profile-$level.txt"
