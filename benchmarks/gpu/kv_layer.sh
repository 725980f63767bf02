#!/usr/bin/env bash
# The KV-layer benchmarks on a CUDA machine (the `device` tool's H200): mlx's CUDA wheel and the
# server's other wheels already installed under /tmp/site; the model is a random-weight llama of
# about 1 GB in bf16, built here with the demo model's tokenizer files (TOKENIZER, a folder).
#     bash benchmarks/gpu/kv_layer.sh TOKENIZER_FOLDER
set -euo pipefail
tokenizer=$(realpath "$1")
source "$(dirname "$0")/common.sh"
model=/tmp/models/llama-1g-bf16
python3 -c 'import mlx.core as mx; print(mx.default_device(), mx.device_info())'
build "$model" 1000 1
cd benchmarks
python3 kv_memory.py --model "$model" 2>&1 | tee "$out/kv_memory.txt"
python3 resume.py --model "$model" --tokens 2000 2>&1 | tee "$out/resume.txt"
python3 multiturn.py --model "$model" --history-tokens 1500 2>&1 | tee "$out/multiturn.txt"
