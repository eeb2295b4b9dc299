#!/bin/bash
# `make gpu-check`: everything a lent GPU should run, in one device call of at most ~9 minutes.
#
#   source .whl/gpu-env.sh && make gpu-check            # on the GPU machine (logs and JSON under $OUT)
#   make gpu-check PYGPU=.venv/bin/python               # on CPU: every gpu test SKIP, the benchmark tiny
#   make gpu-check GPU_CHECK=long                       # the second call: the profile, the full-size benchmark
#                                                         (not the gpu tests: the first call ran them)
#   BENCH_ARGS="--contenders none ds_fast --ks 23" ...   # more gpu_overhead.py arguments (a rerun of some)
#
# 1. what the machine is (env.txt): GPU, driver, torch and its CUDA, kvikio, DeepSpeed, Lightning;
# 2. every `gpu` test alone in its own process (tests/support/run_isolated.py): a PASS / FAIL / HANG /
#    SKIP / NOTRUN line each (gpu-tests.txt), each test's output in gpu-tests.log; no test starts after
#    TESTS_DEADLINE seconds and none runs past TEST_TIMEOUT, so this part ends in bounded time;
# 3. benchmarks/gpu_overhead.py, every contender in a fresh process (bench.txt; bench/gpu_overhead.json
#    and .png): "short" = a ~70 M-parameter model at the interval where the disk keeps up, one round;
#    "long" = the default 403 M-parameter model at half, one and twice that interval. Killed at
#    BENCH_BUDGET seconds; what it measured so far is rendered from its partial JSON. Each fastckpt
#    contender's row also says where its saves went (fastckpt.timings, the breakdown table);
# 4. "long" only (and tiny on CPU): benchmarks/gpu_profile.py, torch.profiler with CUDA activities over
#    3 training steps that each end with a save, for strategies c and g: the Chrome traces, each one's
#    top-20 table and each save's timings under $OUT/profile (profile.md). Run before step 3, killed
#    at PROFILE_BUDGET seconds.
#
# Without CUDA (the suite runs it so it never rots) step 2 must end with every test it ran skipped
# (the first of two files, the rest listed SAMPLED) and step 3 runs every contender with a tiny model. Exit 0 when every part did what it should, else 1.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
PYGPU=${PYGPU:-python3}
GPU_CHECK=${GPU_CHECK:-short}
# sized by the H200 calls of 2026-11-26: 80 tests took ~115 s at 10 at a time, the short benchmark ~230 s
JOBS=${JOBS:-10}
TEST_TIMEOUT=${TEST_TIMEOUT:-120}
TESTS_DEADLINE=${TESTS_DEADLINE:-160}
BENCH_BUDGET=${BENCH_BUDGET:-$([ "$GPU_CHECK" = long ] && echo 420 || echo 270)}  # long: a call of its own
PROFILE_BUDGET=${PROFILE_BUDGET:-120}
SCRATCH=${SCRATCH:-$PWD/.gpu-check-scratch}
mkdir -p "$OUT/bench" "$SCRATCH"
here=$(cd "$(dirname "$0")/../.." && pwd)
status=0

cuda=$("$PYGPU" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  host: $(hostname)  cpus: $(nproc)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PYGPU" - <<'EOF'
import importlib, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
for name in ("kvikio", "cupy", "deepspeed", "lightning", "hydra", "fastckpt._native"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {getattr(mod, '__version__', 'ok')}")
    except Exception as exc:  # what is missing is what the log must say
        print(f"{name} MISSING ({type(exc).__name__}: {exc})")
try:
    import kvikio.defaults
    print("kvikio compat_mode", kvikio.defaults.get("compat_mode"))
except Exception as exc:
    print("kvikio compat_mode unknown:", exc)
EOF
} 2>&1 | tee "$OUT/env.txt"

sample=()
if [ "$cuda" != 1 ]; then
  TESTS_DEADLINE=100000  # no device time to save here: every test gets its turn
  # every gpu test is collected; the first of two files runs in its own process, which shows the
  # runner's path (all of them would only skip, a process each, and the suite already runs each
  # of them, skipping: minutes of CPU that show nothing more; GPU_TESTS_ALL=1 runs all)
  [ -z "${GPU_TESTS_ALL:-}" ] && sample=(--one-per-file --files 2)
fi
if [ "$cuda" = 1 ] && [ "$GPU_CHECK" = long ] && [ -z "${RUN_TESTS:-}" ]; then
  # the first call ran them; the profile and the full-size benchmark fill this one (RUN_TESTS=1: run them too)
  echo "== gpu tests: not in the long call (they ran in the first; RUN_TESTS=1 runs them here too)"
else
  echo "== gpu tests (each in its own process, $TEST_TIMEOUT s each at most, none started after $TESTS_DEADLINE s)"
  # only the files that hold gpu tests are collected (tests/conftest.py refuses a gpu test in a file
  # that does not spell mark.gpu): the whole tree would import every test module first, ~15 s
  mapfile -t gpu_files < <(grep -rl --include='test_*.py' "mark.gpu" "$here/tests" | sort)
  "$PYGPU" "$here/tests/support/run_isolated.py" --timeout "$TEST_TIMEOUT" --deadline "$TESTS_DEADLINE" \
    --jobs "$JOBS" --log "$OUT/gpu-tests.log" "${sample[@]}" -- "${gpu_files[@]}" -m gpu 2>&1 | tee "$OUT/gpu-tests.txt"
  rc=${PIPESTATUS[0]}
  if [ "$cuda" = 1 ] && [ "$rc" != 0 ]; then status=1; fi
  if [ "$cuda" != 1 ] && [ "$rc" != 3 ]; then echo "without CUDA every gpu test should skip (exit $rc)"; status=1; fi
fi

if [ "$cuda" != 1 ]; then
  size=(--d-model 32 --layers 1 --ds-layers 1 --heads 2 --vocab 128 --seq 8 --batch 2 --ks 2 --intervals 2
        --warmup 1 --quiet 3 --child-timeout 300)
elif [ "$GPU_CHECK" = long ]; then
  size=(--intervals 5 --warmup 10 --quiet 20 --child-timeout 240)
else
  size=(--d-model 1024 --layers 4 --ds-layers 2 --heads 8 --pace-only --intervals 3 --warmup 5 --quiet 10
        --child-timeout 90)
fi
if [ "$cuda" != 1 ] || [ "$GPU_CHECK" = long ]; then
  if [ "$cuda" != 1 ]; then
    psize=(--d-model 32 --layers 1 --heads 2 --vocab 128 --seq 8 --batch 2)
  else
    psize=()
  fi
  echo "== gpu_profile.py (torch.profiler over 3 saves of c and g; ${PROFILE_BUDGET} s at most)"
  mkdir -p "$OUT/profile"
  timeout -s KILL "$PROFILE_BUDGET" "$PYGPU" "$here/benchmarks/gpu_profile.py" "${psize[@]}" \
    --child-timeout $((PROFILE_BUDGET / 2)) --out "$OUT/profile" --scratch "$SCRATCH" > "$OUT/profile.txt" 2>&1
  rc=$?
  tail -n 40 "$OUT/profile.txt"
  if [ "$rc" != 0 ]; then status=1; echo "gpu_profile.py ended with exit $rc"; fi
fi

echo "== gpu_overhead.py ($GPU_CHECK; ${BENCH_BUDGET} s at most)"
rm -f "$OUT/bench/gpu_overhead.partial.json"
timeout -s KILL "$BENCH_BUDGET" "$PYGPU" "$here/benchmarks/gpu_overhead.py" "${size[@]}" ${BENCH_ARGS:-} --runs 1 \
  --no-results --out "$OUT/bench" --scratch "$SCRATCH" 2>&1 | tee "$OUT/bench.txt"
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
  status=1
  echo "gpu_overhead.py ended with exit $rc"
  if [ -f "$OUT/bench/gpu_overhead.partial.json" ]; then
    echo "== what it measured before that"
    "$PYGPU" "$here/benchmarks/gpu_overhead.py" --merge "$OUT/bench/gpu_overhead.partial.json" --no-results \
      --out "$OUT/bench" 2>&1 | tee -a "$OUT/bench.txt"
  fi
fi
if grep -qE '^\| [0-9]+ \| [a-z_]+ \| (HANG|exit )' "$OUT/bench.txt"; then
  echo "a contender failed or hung (bench.txt)"
  status=1
fi
rm -rf "$SCRATCH"
echo "gpu-check: $([ $status = 0 ] && echo OK || echo FAILED) (logs under $OUT)"
exit $status
