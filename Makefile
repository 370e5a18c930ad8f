# Two entry points for a fresh machine (see README):
#   make generate   set up .venv, then run `sagevideo generate` on the built-in tiny model (CPU is fine)
#   make test       set up .venv, then run the test suite (all of it: what CI runs)
#   make test-fast  the edit-test loop: the suite without the tests marked slow (Ray, subprocess and
#                   multi-process runs, torch.compile; `make test` still runs them)
#
# The pins below only apply to this development venv: they take the CPU build of torch and the
# triton wheel that lie on the CPU machines' disk (an unpinned torch pulls a multi-GB CUDA build).
# On a GPU machine, run `make test TORCH_PINS=` to keep the torch you have.
PYTHON ?= python3
VENV ?= .venv
TORCH_PINS ?= torch==2.13.0 triton==3.8.0
OUT ?= outputs/demo

.PHONY: generate test test-fast lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check $(TORCH_PINS) -e '.[dev,eval]'
	touch $@

generate: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(VENV)/bin/sagevideo generate --out $(OUT)

test: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q

# A command-line -m replaces the one in pyproject's addopts, so "not sass" is repeated here.
test-fast: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q -m "not slow and not sass"

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(OUT)
