# Two commands on a fresh machine: `make demo` and `make test` (`make test-fast`: a quick subset).
# torch is installed first, as the CPU build (no CUDA / nvidia wheels): a local wheel when pip
# finds one without an index (this machine keeps torch 2.13.0+cpu in its find-links), else from
# PyTorch's CPU index, TORCH_INDEX. Elsewhere, override it, e.g.
#   make install TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu128"
# or point VENV at an environment that already has a torch (TORCH_SPEC= skips the step).
PY ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_SPEC ?= cpu
BIN := $(VENV)/bin
STAMP := $(VENV)/.soulmem-installed
# the quick subset: everything but the tests that start many interpreters, processes or servers
# (the command line, locking, sharding, batch memory), wait on timeouts (forgetting's bounds and
# interrupts), run the notebooks or walk the README
FAST_IGNORE := --ignore=tests/cli --ignore=tests/test_notebooks.py --ignore=tests/test_readme.py \
	--ignore=tests/test_readme_walk.py --ignore=tests/store/test_locking.py \
	--ignore=tests/bank/test_sharded.py --ignore=tests/retrieve/test_batch_memory.py \
	--ignore=tests/forget/test_atomic.py --ignore=tests/forget/test_bounds.py

.PHONY: install test test-fast lint demo bench gpu-check clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@if [ "$(TORCH_SPEC)" = cpu ]; then \
		if $(BIN)/python -m pip install -q --no-index --no-deps "torch==$(TORCH_VERSION)" \
			2>/dev/null; then \
			echo "torch $(TORCH_VERSION): the local wheel"; \
			$(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)"; \
		else \
			echo "torch $(TORCH_VERSION): the CPU build from $(TORCH_INDEX)"; \
			$(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)" --index-url $(TORCH_INDEX); \
		fi; \
		$(BIN)/python -c "import sys, torch; sys.exit(torch.version.cuda and \
			f'expected the CPU build of torch, found {torch.__version__} (CUDA {torch.version.cuda})')"; \
	elif [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install -q $(TORCH_SPEC); fi
	$(BIN)/python -m pip install -q -e '.[dev,serve]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check soulmem_torch tests benchmarks
	$(BIN)/ruff format --check soulmem_torch tests benchmarks

# The suite runs on every core (pytest-xdist; TEST_WORKERS=0 runs it in this process).
TEST_WORKERS ?= auto

test: $(STAMP)
	$(BIN)/ruff check soulmem_torch tests benchmarks
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

test-fast: $(STAMP)
	$(BIN)/ruff check soulmem_torch tests benchmarks
	$(BIN)/python -m pytest -q -m "not slow" $(FAST_IGNORE)

demo: $(STAMP)
	$(BIN)/soulmem demo

# The full CPU suite with the peers side by side (~15 min, ~13 GB RAM); tables in RESULTS.md.
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,peers]'
	SOULMEM_BENCH_ROWS=bench-rows.jsonl $(BIN)/python -m pytest benchmarks \
		--benchmark-enable --benchmark-only -q
	$(BIN)/python -m benchmarks.report bench-rows.jsonl

gpu-check:
	bash benchmarks/gpu_check.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .benchmarks
