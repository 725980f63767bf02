#!/usr/bin/env bash
# The KV-layer benchmarks on a CUDA machine (the `device` tool's H200): mlx's CUDA wheel and the
# server's other wheels already installed under /tmp/site; the model is a random-weight llama of
# about 1 GB in bf16, built here with the demo model's tokenizer files (TOKENIZER, a folder).
#     bash benchmarks/gpu/kv_layer.sh TOKENIZER_FOLDER
set -euo pipefail
tokenizer=$(realpath "$1")
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
out=${OUT:-/tmp/out}; mkdir -p "$out"
model=/tmp/models/llama-1g-bf16
python3 -c 'import mlx.core as mx; print(mx.default_device(), mx.device_info())'
[ -f "$model/config.json" ] || python3 -c "
from pool.catalog.fixture_models import make_fixture_model
make_fixture_model('$model', 1000, tokenizer_from='$tokenizer', dtype='bfloat16', seed=1)"
cd benchmarks
python3 kv_memory.py --model "$model" 2>&1 | tee "$out/kv_memory.txt"
python3 resume.py --model "$model" --tokens 2000 2>&1 | tee "$out/resume.txt"
python3 multiturn.py --model "$model" --history-tokens 1500 2>&1 | tee "$out/multiturn.txt"
