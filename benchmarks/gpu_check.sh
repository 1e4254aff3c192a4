#!/usr/bin/env bash
# GPU check: the CUDA tests, then the GPU benchmarks, in at most ~7 minutes (the stage limits);
# results under $OUT.
#
# Prepare (on the machine with the checkout, once):
#     mkdir -p .whl && cp ../shared/gpu-wheels/*.whl .whl/
#     .venv/bin/pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --platform manylinux2014_x86_64 -d .whl pytest pluggy iniconfig packaging pygments \
#         pytest-benchmark py-cpuinfo2 hypothesis sortedcontainers
# Run (on the GPU machine, from the repository root; the device tool: carry [".whl"]):
#     bash benchmarks/gpu_check.sh
#
# Writes to ${OUT:-./gpu-results}:
#     machine.txt            python / torch / CUDA / GPU, date
#     tests.txt, tests.xml   pytest -k "cuda or device" over tests/
#     bench-*.json           pytest-benchmark JSON (timings + extra_info: error, floor, ...)
#     rows-*.jsonl           the same rows, one JSON object per line, written as each case
#                            ends (kept even when a stage hits its time limit)
#     bench-*.txt            pytest output (incl. the time / error / floor tables)
#     summary.md             every table + the memory-traffic floors + the target checks
# Each stage has its own time limit, so one slow or failing stage does not stop the others;
# the stages' exit codes are in status.txt.
#
# PPR on CUDA: stage ppr-f32 runs first, so its rows exist even if a later stage hits its
# limit: power (float64) next to power-f32 (dtype=torch.float32) on n = 3000, BA 100k and
# Chung–Lu 1M nodes / 10M edges, b1 / 64 / 256. Stage ppr adds every other method on n = 3000
# and BA 100k (power-local / power-local-f32 on n = 3000), stage chunglu the rest of Chung–Lu
# (power and power-f32 on 10M nodes / 100M edges included).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-results}"
mkdir -p "$OUT"
STATUS="$OUT/status.txt"
: > "$STATUS"
T0=$(date +%s)
stage() {  # stage NAME LIMIT_SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local t=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "$name rc=$rc seconds=$(( $(date +%s) - t ))" | tee -a "$STATUS"
}

# -- dependencies: the wheels carried in .whl/ (pydantic, jieba, rapidfuzz, pytest stack) -----
export PYTHONPATH="$PWD"
if ls .whl/*.whl >/dev/null 2>&1; then
  pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site "$@"; }
  # all at once; if one wheel does not fit this interpreter, the rest one by one
  pipi .whl/*.whl || for w in .whl/*.whl; do pipi "$w" || echo "wheel not installed: $w"; done
  export PYTHONPATH="/tmp/site:$PWD"
fi
python3 - > "$OUT/machine.txt" 2>&1 <<'EOF'
import datetime, platform, torch
print("date", datetime.datetime.now(datetime.timezone.utc).isoformat())
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.0f} GiB", "sm", f"{p.major}.{p.minor}")
else:
    print("gpu: none (CUDA not available)")
for mod in ("torch_geometric", "pydantic", "jieba", "rapidfuzz", "pytest", "pytest_benchmark",
            "hypothesis", "numpy", "scipy"):
    try:
        m = __import__(mod)
        print(mod, getattr(m, "__version__", "?"))
    except Exception as exc:  # noqa: BLE001
        print(mod, "MISSING", type(exc).__name__, exc)
EOF
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
cat "$OUT/machine.txt"

# -- 1. CUDA tests (the device fixture runs them on cpu and cuda; -k keeps the cuda half) ----
stage tests 90 python3 -m pytest -q tests -k "cuda or device" -p no:cacheprovider \
  -o addopts="-ra" --junitxml="$OUT/tests.xml" > "$OUT/tests.txt" 2>&1
tail -5 "$OUT/tests.txt"

# -- 2. GPU benchmarks (modest rounds: ~0.3 s of timed calls per case) ----------------------
export SOULMEM_BENCH_SECONDS="${SOULMEM_BENCH_SECONDS:-0.3}"
export SOULMEM_BENCH_MAX_ROUNDS="${SOULMEM_BENCH_MAX_ROUNDS:-20}"
export SOULMEM_BENCH_THREADS="${SOULMEM_BENCH_THREADS:-0}"  # CPU-side set-up: all cores
bench() {  # bench NAME LIMIT FILE -k EXPR
  local name=$1 limit=$2 file=$3
  shift 3
  SOULMEM_BENCH_ROWS="$OUT/rows-$name.jsonl" stage "bench-$name" "$limit" \
    python3 -m pytest -q "$file" "$@" -p no:cacheprovider -o addopts="" --benchmark-enable \
    --benchmark-only --benchmark-json="$OUT/bench-$name.json" --benchmark-columns=min,mean,rounds \
    > "$OUT/bench-$name.txt" 2>&1
}
bench ppr-f32 60 benchmarks/test_bench_ppr.py \
  -k "cuda and (n3000 or ba100k or chunglu1M) and (power-b or power-f32)"
bench ppr 80 benchmarks/test_bench_ppr.py -k "cuda and (n3000 or ba100k) and not power-b and not power-f32"
bench chunglu 75 benchmarks/test_bench_ppr.py \
  -k "cuda and chunglu and not (chunglu1M and (power-b or power-f32))"
bench similarity 45 benchmarks/test_bench_similarity.py -k "cuda"
bench pipeline 60 benchmarks/test_bench_pipeline.py -k "cuda and 1M"
# MemoryBank: 10,000 agents × 100 notes, 1,000 queries from 1,000 agents per call (target:
# >= 10,000 queries/s through the whole pipeline), next to the per-agent loop on 20 queries
bench bank 75 benchmarks/test_bench_bank.py -k "cuda"

# -- 3. summary ------------------------------------------------------------------------------
shopt -s nullglob
rows=("$OUT"/rows-*.jsonl)
if [ ${#rows[@]} -gt 0 ]; then
  python3 -m benchmarks.report "${rows[@]}" > "$OUT/summary.md" 2>&1
  echo "report rc=$?" >> "$STATUS"
fi
echo "total seconds=$(( $(date +%s) - T0 ))" | tee -a "$STATUS"
[ -f "$OUT/summary.md" ] && sed -n '/#### targets/,$p' "$OUT/summary.md"
exit 0
