# Two entry points for a fresh machine (see README):
#   make generate   set up .venv, then run `sagevideo generate` on the built-in tiny model (CPU is fine)
#   make test       set up .venv, then run the test suite (all of it: what CI runs)
#   make test-fast  the edit-test loop: the suite without the tests marked slow (Ray, subprocess and
#                   multi-process runs, torch.compile, end-to-end benchmark runs) or kernels (the Triton
#                   kernels' own tests, interpreted on a CPU: `pytest tests/kernels` after changing a
#                   kernel); `make test` still runs them all
#
# Both spread the tests over TEST_WORKERS pytest-xdist processes (work stealing: a worker that runs
# out takes tests from the other), each torch at one thread (OMP_NUM_THREADS=1: two workers of two
# threads each on two cores would fight over them). A single-process run is plain `pytest`.
#
# The pins below only apply to this development venv: they take the CPU build of torch and the
# triton wheel that lie on the CPU machines' disk (an unpinned torch pulls a multi-GB CUDA build).
# On a GPU machine, run `make test TORCH_PINS=` to keep the torch you have.
PYTHON ?= python3
VENV ?= .venv
TORCH_PINS ?= torch==2.13.0 triton==3.8.0
OUT ?= outputs/demo
TEST_WORKERS ?= 2
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist worksteal
# The tests start many Python processes (CLI subprocesses, Ray workers, gloo and torchrun ranks) and
# each imports sagevideo: with bytecode caching they share one compile of its sources, and a second
# run reuses pytest's rewritten test modules. Some machines set PYTHONDONTWRITEBYTECODE; it is
# lifted for the test runs only (__pycache__ is ignored).
TEST_ENV = env -u PYTHONDONTWRITEBYTECODE HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1

.PHONY: generate test test-fast lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check $(TORCH_PINS) -e '.[dev,eval]'
	touch $@

generate: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(VENV)/bin/sagevideo generate --out $(OUT)

test: $(VENV)/.installed
	$(TEST_ENV) $(VENV)/bin/python -m pytest -q $(PYTEST_PARALLEL)

# A command-line -m replaces the one in pyproject's addopts, so "not sass" is repeated here.
test-fast: $(VENV)/.installed
	$(TEST_ENV) $(VENV)/bin/python -m pytest -q $(PYTEST_PARALLEL) -m "not slow and not kernels and not sass"

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(OUT)
