# Two commands on a fresh machine: `make demo` and `make test`.
# The CPU build of torch is installed first (this machine keeps torch 2.13.0 CPU on disk);
# elsewhere, override it, e.g.  make test TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu128"
# or point VENV at an environment that already has a CUDA torch (TORCH_SPEC= skips the step).
PY ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.soulmem-installed

.PHONY: install test lint demo bench gpu-check clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install -q $(TORCH_SPEC); fi
	$(BIN)/python -m pip install -q -e '.[dev,serve]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check soulmem_torch tests benchmarks
	$(BIN)/ruff format --check soulmem_torch tests benchmarks

test: $(STAMP)
	$(BIN)/ruff check soulmem_torch tests benchmarks
	$(BIN)/python -m pytest -q

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
