# Sourced by the scripts beside it, run from the checkout's root on the CUDA machine (after setup.sh):
# the installed wheels on the path, $out for the results ($OUT under the device tool), and build, which
# writes a random-weight llama with the demo model's tokenizer files ($tokenizer) unless it is there.
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
out=${OUT:-/tmp/out}; mkdir -p "$out"

build() {   # folder, size in MB, seed[, bits]
  [ -f "$1/config.json" ] || python3 -c "
from pool.catalog.fixture_models import make_fixture_model
make_fixture_model('$1', $2, tokenizer_from='$tokenizer', dtype='bfloat16', seed=$3${4:+, bits=$4})"
}

limit() {   # seconds a benchmark may run: DEADLINE (500), or less where END (a `date +%s` time) comes first
  local left=$(( ${END:-9999999999} - $(date +%s) - 10 ))
  left=$(( left < ${DEADLINE:-500} ? left : ${DEADLINE:-500} ))
  echo $(( left < 1 ? 1 : left ))    # timeout takes 0 as no limit, and no negative
}
