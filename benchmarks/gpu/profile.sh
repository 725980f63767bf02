#!/usr/bin/env bash
# Where the server's time goes at many streams on the CUDA machine: py-spy (carried as a wheel under
# .whl/prof) samples `manage.py serve` while concurrency.py runs one wave at LEVEL streams; the raw
# samples are summarised per thread into $OUT/profile-LEVEL-summary.txt (benchmarks/profile_summary.py)
# and kept gzipped in $OUT/profile-LEVEL.txt.gz.
#     bash benchmarks/gpu/profile.sh MODEL_FOLDER [LEVEL]
set -uo pipefail
model=$1; level=${2:-32}
source "$(dirname "$0")/common.sh"
[ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/prof/*.whl
(for _ in $(seq 120); do pid=$(pgrep -f "manage.py serve" | head -1); [ -n "$pid" ] && break; sleep 0.5; done
 sleep 5; /tmp/spy/bin/py-spy record -p "$pid" -r 200 -d 100 -f raw --threads -o "$out/profile-$level.txt" >/dev/null 2>&1 \
   || echo "py-spy could not sample here") &
cd benchmarks && python3 concurrency.py --model "$model" --levels "$level" --tokens 512 --rounds 1
wait
cd .. && [ -f "$out/profile-$level.txt" ] && python3 benchmarks/profile_summary.py "$out/profile-$level.txt" | tee "$out/profile-$level-summary.txt" \
  && gzip -f "$out/profile-$level.txt"
