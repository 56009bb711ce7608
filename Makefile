# mmrl developer entry points. `make demo` and `make test` work on a fresh clone: both run `setup` first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mmrl-installed

.PHONY: setup demo test test-fast bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch torchvision
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/mmrl train --task video-qa

test: setup
	$(PY) -m pytest -n 2 --dist loadgroup tests

bench: setup
	$(PY) -m perf

lint: setup
	$(VENV)/bin/ruff check mmrl mmrl_common vision video rewards data_pipelines tests perf

clean:
	rm -rf $(VENV) .pytest_cache
