#!/usr/bin/env bash
# Installs the server's wheels on the CUDA machine (the `device` tool's H200), which reaches no
# package registry. Here, once: the wheels for CPython 3.12 go under .whl/ (git-ignored), mlx's CUDA
# wheel split in three (over one call's 64 MiB):
#     pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl/small \
#       mlx==0.32.4 mlx-lm==0.32.2 django daphne channels twisted llguidance sqlite-utils asgiref autobahn txaio \
#       zope.interface constantly hyperlink incremental automat sqlparse sqlite-fts4 click-default-group \
#       pyopenssl service-identity cryptography cffi pycparser cbor2 u-msgpack-python ujson tzdata pyasn1 pyasn1-modules
#       dj-database-url psycopg channels-redis redis msgpack typing_extensions
#     (the versions this checkout's .venv has; the image has numpy, transformers, tokenizers, psutil,
#      prometheus-client, httpx, jinja2 and the CUDA libraries already)
#     pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_35_x86_64 -d .whl/big mlx-cuda-13==0.32.4
#     split -b 30000000 .whl/big/mlx_cuda_13-*.whl .whl/big/cuda.part
# One device call copies the first two parts to /tmp/w (carry .whl/big/cuda.partaa .whl/big/cuda.partab);
# the next, while the machine is warm, carries the third part and .whl/small and runs this script,
# which joins the wheel and installs everything under /tmp/site in one pip call (speed.sh and
# kv_layer.sh use it). Installing .whl/small again later with --upgrade would replace the CUDA
# build's libmlx.so with the plain wheel's: reinstall both together instead.
set -euo pipefail
mkdir -p /tmp/w
if [ ! -d /tmp/site/mlx ]; then
  cat /tmp/w/cuda.partaa /tmp/w/cuda.partab .whl/big/cuda.partac > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    /tmp/w/mlx_cuda_13-*.whl .whl/small/*.whl
fi
PYTHONPATH=/tmp/site python3 -c 'import mlx.core as mx, mlx_lm, django, daphne, channels; print(mx.default_device(), mx.__version__)'
