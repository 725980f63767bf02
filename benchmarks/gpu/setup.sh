#!/usr/bin/env bash
# Installs the server's wheels on the CUDA machine (the `device` tool's H200), which reaches no
# package registry. Here, once: the wheels for CPython 3.12 go under .whl/ (git-ignored), mlx's CUDA
# wheel split in three (over one call's 64 MiB):
#     pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_35_x86_64 ... -d .whl/small
#     split -b 30000000 mlx_cuda_13-*.whl .whl/big/cuda.part
# One device call copies the first two parts to /tmp/w (carry .whl/big/cuda.partaa .whl/big/cuda.partab);
# the next, while the machine is warm, carries the third part and .whl/small and runs this script,
# which joins the wheel and installs everything under /tmp/site (speed.sh and kv_layer.sh use it).
set -euo pipefail
mkdir -p /tmp/w
if [ ! -d /tmp/site/mlx ]; then
  cat /tmp/w/cuda.partaa /tmp/w/cuda.partab .whl/big/cuda.partac > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    /tmp/w/mlx_cuda_13-*.whl .whl/small/*.whl
fi
PYTHONPATH=/tmp/site python3 -c 'import mlx.core as mx, mlx_lm, django, daphne, channels; print(mx.default_device(), mx.__version__)'
