# Two commands for users: `make sweep` and `make test`. Everything else is plumbing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
OUT    ?= isoflop-runs

.PHONY: setup sweep test clean

setup: $(STAMP)

# Torch's CPU build is pinned and installed first, so the project's loose `torch`
# requirement never pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

sweep: setup
	$(BIN)/isoflop sweep --out $(OUT)
	$(BIN)/isoflop fit $(OUT)/default

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(OUT)
