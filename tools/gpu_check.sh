#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tools/gpu_check.sh [results-dir]: everything trainkit checks on an NVIDIA GPU, in one short run
# (< 8 minutes): configures the CUDA tier for sm_90 in build-gpu/, builds what it runs (the
# executables of the `cuda` tests, train_gpt, train_gpt_cuda; no header tests), runs the ctest
# labels `cuda` and `nccl`, the flagship train_gpt_cuda (fp32 losses against the CPU build, bf16
# and fp16 runs whose loss falls, compute-sanitizer memcheck), then the GPU benchmarks
# (`bench/run gpu`: names ending in _gpu or gpu = 1 in their bench.conf). Prints a table and
# writes it, with every log, to results-dir (default $OUT, else ./gpu-results). Exit: 0 all passed, 1 something failed, 2 no usable GPU/toolchain here.
# Environment: TRAINKIT_GPU_CHECK_BUDGET (seconds, default 470), TRAINKIT_GPU_CHECK_BUILD_DIR
#   (default build-gpu), CUDA_HOME (default /usr/local/cuda),
#   TRAINKIT_GPU_CHECK_BENCH (benchmark names, default: every GPU benchmark),
#   TRAINKIT_GPU_CHECK_TEST_TIMEOUT (seconds per test executable, default 120),
#   TRAINKIT_GPU_CHECK_PREBUILT=1: the build folder was configured and built on another machine
#   (same CUDA major version, sm_90; tools/gpu_check.sh --prepare does it here, without a GPU):
#   nothing is configured or built, the test executables are run directly, so a GPU machine
#   without doctest, MPI or the build's compilers can run the check. Shared libraries that the
#   executables cannot find (cuBLASLt, NCCL, the CUDA runtime) are looked up in CUDA_HOME and in
#   the nvidia-* Python wheels (PyTorch's) and added to LD_LIBRARY_PATH, in either mode.
#   TRAINKIT_BENCH_PYTHON (Python with torch for benchmark peers; by default .venv-bench, else a
#   python3 that imports torch; nothing is downloaded).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
BUILD=${TRAINKIT_GPU_CHECK_BUILD_DIR:-build-gpu}
PREBUILT=${TRAINKIT_GPU_CHECK_PREBUILT:-0}
# The flagship's two builds, whose losses the check compares (both built with nvcc present).
CUDA_TARGETS=(train_gpt train_gpt_cuda)

if [[ ${1:-} == --prepare ]]; then  # on a build machine: configure and build what the check runs
  shift
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DTRAINKIT_ENABLE_CUDA=ON -DTRAINKIT_ENABLE_MPI=OFF -DTRAINKIT_ENABLE_BLAS=OFF \
    -DTRAINKIT_ENABLE_OPENMP=OFF -DTRAINKIT_BUILD_TESTS=ON -DTRAINKIT_PACKAGE_TESTS=OFF \
    -DTRAINKIT_HEADER_TESTS=OFF "$@" || exit 1
  mapfile -t tests < <(ninja -C "$BUILD" -t targets all | grep -oE '^test_[a-z0-9_]+_cuda:' |
    tr -d ':' | sort -u)
  ninja -C "$BUILD" "${tests[@]}" "${CUDA_TARGETS[@]}" || exit 1
  echo "gpu_check: prepared $BUILD (${#tests[@]} test executables, ${CUDA_TARGETS[*]});" \
    "run TRAINKIT_GPU_CHECK_PREBUILT=1 tools/gpu_check.sh on the GPU machine"
  exit 0
fi
RES=${1:-${OUT:-$ROOT/gpu-results}}
mkdir -p "$RES" || { echo "gpu_check: cannot create results folder $RES" >&2; exit 2; }
RES=$(cd "$RES" && pwd)
BUDGET=${TRAINKIT_GPU_CHECK_BUDGET:-470}
TABLE="$RES/summary.md"
START=$SECONDS
FAILED=0

: > "$TABLE"
say() { echo "$*" | tee -a "$TABLE"; }
# row STEP RESULT DETAILS: a line of the table ('|' in DETAILS would split its cell: made '/')
row() { printf '| %-24s | %-7s | %s |\n' "$1" "$2" "${3//|/\/}" | tee -a "$TABLE"; }
left() { echo $((BUDGET - (SECONDS - START))); }

# step NAME CAP_SECONDS CMD...: runs CMD into $RES/NAME.log under min(CAP, time left); sets RC
step() {
  local name=$1 cap=$2 t
  shift 2
  t=$(left)
  ((t > cap)) && t=$cap
  if ((t < 15)); then
    RC=124; echo "gpu_check: no time left for $name" >> "$RES/$name.log"; return
  fi
  echo "gpu_check: $name (limit ${t}s): $*" >&2
  timeout -k 5 "$t" "$@" > "$RES/$name.log" 2>&1
  RC=$?
}

outcome() {  # words for the last step's status
  case $RC in
    0) echo ok ;; 124 | 137) echo "timed out or skipped for lack of time" ;; *) echo "status $RC" ;;
  esac
}

no_gpu() {
  say "gpu_check: $1"
  say "gpu_check: nothing was run; this script needs a machine with an NVIDIA GPU, its driver"
  say "(nvidia-smi) and the CUDA toolkit (nvcc). Results folder: $RES"
  exit 2
}

# ---- preflight: fail early and clearly ----------------------------------------------------------
command -v nvidia-smi > /dev/null || no_gpu "nvidia-smi not found: no NVIDIA driver on this machine."
nvidia-smi -L > "$RES/nvidia-smi-L.txt" 2>&1
grep -q '^GPU ' "$RES/nvidia-smi-L.txt" ||
  no_gpu "nvidia-smi lists no GPU: $(head -c 300 "$RES/nvidia-smi-L.txt" | tr '\n' ' ')"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
command -v nvcc > /dev/null || export PATH="$CUDA_HOME/bin:$PATH"
# A prebuilt run needs nvcc only for the GPU benchmarks' own builds: without it those rows fail
# and the tests and the flagship still run.
if ! command -v nvcc > /dev/null; then
  [[ $PREBUILT == 1 ]] || no_gpu "nvcc not found (looked in PATH and $CUDA_HOME/bin)."
  say "- nvcc not found (looked in PATH and $CUDA_HOME/bin): the benchmarks that compile will fail"
fi
[[ $PREBUILT == 1 ]] || command -v cmake > /dev/null || no_gpu "cmake not found."
GEN=(); command -v ninja > /dev/null && GEN=(-G Ninja)
JOBS=$(nproc)

# add_lib_dirs EXE...: for each shared library the executables cannot load, the first folder of
# CUDA_HOME or of an nvidia-* wheel that holds it goes onto LD_LIBRARY_PATH.
add_lib_dirs() {
  local lib dir found
  local -a dirs=("$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib")
  local wheels
  wheels=$(python3 -c 'import nvidia, os; print("\n".join(nvidia.__path__))' 2> /dev/null)
  while IFS= read -r dir; do
    [[ -n $dir ]] && dirs+=("$dir"/*/lib)
  done <<< "$wheels"
  while IFS= read -r lib; do
    found=""
    for dir in "${dirs[@]}"; do
      if [[ -e $dir/$lib ]]; then found=$dir; break; fi
    done
    if [[ -n $found ]]; then
      export LD_LIBRARY_PATH="$found${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "gpu_check: $lib from $found" >&2
    else
      echo "gpu_check: $lib not found in CUDA_HOME or the nvidia Python wheels" >&2
    fi
  done < <(for exe in "$@"; do [[ -x $exe ]] && ldd "$exe" 2> /dev/null; done |
    awk '/not found/ {print $1}' | sort -u)
}

GPU=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
  2> /dev/null | head -n 1)
say "# trainkit GPU check"
say ""
say "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $(git rev-parse --short HEAD 2> /dev/null || echo '?')$( \
  [[ -n $(git status --porcelain 2> /dev/null) ]] && echo ' (+ uncommitted changes)')"
say "- GPU: $GPU ($(grep -c '^GPU ' "$RES/nvidia-smi-L.txt") visible)"
say "- nvcc: $(nvcc --version 2> /dev/null | grep -o 'release [0-9.]*' | head -n 1); host: $(grep -m1 'model name' \
  /proc/cpuinfo | cut -d: -f2 | xargs), $JOBS cores"
say ""
row step result details
row "------------------------" "-------" "-------"

# GPU benchmarks compile while the tests run (bench/run builds each with nvcc/g++ when stale).
if [[ -z ${TRAINKIT_BENCH_PYTHON:-} && ! -x .venv-bench/bin/python ]]; then
  export TRAINKIT_BENCH_NO_INSTALL=1  # a GPU box may be offline: never try to download torch
  python3 -c 'import torch' 2> /dev/null && export TRAINKIT_BENCH_PYTHON=python3
fi
BENCH_NAMES=${TRAINKIT_GPU_CHECK_BENCH-$(bench/run --list | awk 'NR > 1 && $2 == "gpu" {print $1}' |
  tr '\n' ' ')}
TEST_TIMEOUT=${TRAINKIT_GPU_CHECK_TEST_TIMEOUT:-120}
if [[ -n $BENCH_NAMES ]]; then
  # shellcheck disable=SC2086
  bench/run --build-only $BENCH_NAMES > "$RES/bench_build.log" 2>&1 &
  BENCH_BUILD_PID=$!
fi

if [[ $PREBUILT == 1 ]]; then
  # ---- a build made elsewhere: run each CUDA test executable directly ---------------------------
  mapfile -t TESTS < <(find "$BUILD/tests" -maxdepth 1 -type f -name 'test_*_cuda' -perm -u+x |
    sort)
  add_lib_dirs "${TESTS[@]}" "$BUILD/examples/train_gpt_cuda"
  # The tests read fixtures from the source folder of the build machine (TRAINKIT_TEST_DATA_DIR,
  # compiled in): where that folder is missing here, it becomes a link to this checkout.
  SRC=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2> /dev/null)
  if [[ -n $SRC && ! -e $SRC/tests/fixtures ]]; then
    if [[ ! -e $SRC ]] && mkdir -p "$(dirname "$SRC")" && ln -s "$ROOT" "$SRC"; then
      row fixtures link "$SRC -> $ROOT (the tests' compiled-in source folder)"
    else
      row fixtures FAIL "$SRC/tests/fixtures, compiled into the tests, is missing here"; FAILED=1
    fi
  fi
  row build prebuilt "${#TESTS[@]} CUDA test executables in $BUILD, built elsewhere"
  ((${#TESTS[@]} > 0)) || { row "CUDA tests" FAIL "none in $BUILD/tests"; FAILED=1; }
  for exe in "${TESTS[@]}"; do
    name=$(basename "$exe")
    step "$name" "$TEST_TIMEOUT" "$exe"
    summary=$(grep -E '^\[doctest\] test cases:' "$RES/$name.log" | tail -n 1 |
      sed 's/^\[doctest\] //')
    if ((RC == 0)); then
      row "$name" ok "${summary:-no doctest summary}"
    elif ((RC == 77)); then
      row "$name" SKIP "exit 77 (no usable GPU?): $(tail -n 1 "$RES/$name.log" | cut -c1-100)"
      FAILED=1
    else
      row "$name" FAIL "$(outcome): ${summary:-$(tail -n 1 "$RES/$name.log" | cut -c1-100)}"
      FAILED=1
    fi
  done
fi

# ---- configure + build --------------------------------------------------------------------------
if [[ $PREBUILT != 1 ]]; then
# Header and package tests off: the build below makes only what the check runs (the whole tree,
# ~330 translation units with the header tests, does not fit the budget on 16 cores).
step configure 120 cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DTRAINKIT_ENABLE_CUDA=ON -DTRAINKIT_BUILD_TESTS=ON \
  -DTRAINKIT_HEADER_TESTS=OFF -DTRAINKIT_PACKAGE_TESTS=OFF
if ((RC == 0)); then
  row configure ok "$(grep -m1 -o 'backends: .*' "$RES/configure.log")"
else
  row configure FAIL "status $RC, see configure.log: $(grep -m1 -i 'error' "$RES/configure.log" |
    cut -c1-100)"
  FAILED=1
fi

if ((RC == 0)); then
  KEEP=(); [[ ${#GEN[@]} -gt 0 ]] && KEEP=(-- -k 0)  # build what compiles, report the rest
  # the executables of the tests labelled cuda (CTest name AREA_cuda, target test_AREA_cuda)
  mapfile -t tests < <(ctest --test-dir "$BUILD" -N -L '^cuda$' 2> /dev/null |
    sed -nE 's/^ *Test +#[0-9]+: ([a-z0-9_]+_cuda)$/test_\1/p' | sort -u)
  step build 300 cmake --build "$BUILD" -j "$JOBS" --target "${tests[@]}" "${CUDA_TARGETS[@]}" \
    "${KEEP[@]}"
  if ((RC == 0)); then
    row build ok "$(grep -c 'Linking' "$RES/build.log") targets linked"
  else
    row build FAIL "$(outcome) (build.log): $(grep -m1 -E 'error:|FAILED:' "$RES/build.log" |
      cut -c1-100)"
    FAILED=1
  fi

  # ---- ctest -L cuda / -L nccl ------------------------------------------------------------------
  for label in cuda nccl; do
    step "ctest_$label" 150 ctest --test-dir "$BUILD" -L "^$label\$" --output-on-failure \
      --timeout 120 -j 2
    log="$RES/ctest_$label.log"
    summary=$(grep -E 'tests passed|No tests were found' "$log" | tail -n 1)
    skipped=$(grep -c '(Skipped)' "$log")
    if [[ $summary == *"No tests were found"* ]]; then
      row "ctest -L $label" none "no test has this label"
    elif ((RC == 0 && skipped == 0)); then
      row "ctest -L $label" ok "$summary"
    elif ((RC == 0)); then  # CTest counts exit 77 as passed; on this machine it is a failure
      row "ctest -L $label" SKIP "$summary; $skipped skipped (exit 77: no usable GPU?) ($log)"
      FAILED=1
    else
      failed=$(sed -n '/following tests FAILED/,$p' "$log" | grep -E '^\s+[0-9]+ - ' |
        awk '{print $3}' | tr '\n' ' ')
      row "ctest -L $label" FAIL "$(outcome): ${summary:-no summary}; failed: ${failed:-?} ($log)"
      FAILED=1
    fi
  done
fi
add_lib_dirs "$BUILD/examples/train_gpt_cuda"  # the prebuilt branch did this before its tests
fi  # not PREBUILT

# ---- the flagship on the GPU ----------------------------------------------------------------------
# fp32 on the GPU against the CPU build from the same seed and data (30 steps, the loss of every
# step from metrics.jsonl: within 2e-3 relative, the drift of two f32 reduction orders over 30
# Adam steps); bf16 and fp16 runs of 200 steps whose loss must fall (--check); compute-sanitizer
# memcheck on a 3-step bf16 run.
TG="$BUILD/examples/train_gpt"
if [[ -x ${TG}_cuda && -x $TG ]]; then
  flag=(--steps 30 --log-every 1 --eval-every 30 --sample-chars 0 --dropout 0 --seed 7)
  rm -rf "$RES/tg_cpu" "$RES/tg_gpu"
  step train_gpt_cpu_fp32 120 "$TG" "${flag[@]}" --out "$RES/tg_cpu"
  cpu_rc=$RC
  step train_gpt_gpu_fp32 120 "${TG}_cuda" "${flag[@]}" --device cuda --out "$RES/tg_gpu"
  if ((RC == 0 && cpu_rc == 0)); then
    cmp=$(python3 - "$RES/tg_cpu/metrics.jsonl" "$RES/tg_gpu/metrics.jsonl" <<'PY'
import json, sys
def losses(path):  # a loss not read at a step is null in metrics.jsonl
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if r.get("loss") is not None}
try:
    a, b = losses(sys.argv[1]), losses(sys.argv[2])
except (OSError, ValueError, KeyError) as e:
    sys.exit(print(f"cannot read the losses: {type(e).__name__}: {e}"[:150]) or 1)
steps = sorted(set(a) & set(b))
worst = (max((abs(a[s] - b[s]) / max(abs(a[s]), 1e-30), s) for s in steps) if steps
         else (float("inf"), 0))
print(f"{len(steps)} steps, max rel diff {worst[0]:.2e} at step {worst[1]}")
sys.exit(0 if len(steps) == 30 and worst[0] <= 2e-3 else 1)
PY
)
    if (($? == 0)); then row "train_gpt fp32 gpu=cpu" ok "$cmp"; else
      row "train_gpt fp32 gpu=cpu" FAIL "$cmp"; FAILED=1; fi
  else
    row "train_gpt fp32 gpu=cpu" FAIL "cpu status $cpu_rc, gpu $(outcome) (train_gpt_*_fp32.log)"
    FAILED=1
  fi
  for p in bf16 fp16; do
    rm -rf "$RES/tg_$p"
    step "train_gpt_gpu_$p" 120 "${TG}_cuda" --device cuda --precision "$p" --steps 200 \
      --check --out "$RES/tg_$p"
    if ((RC == 0)); then
      row "train_gpt $p 200 steps" ok "$(grep -o 'train loss [^|]*| val loss [^|]*| [0-9.]* ms/step' \
        "$RES/train_gpt_gpu_$p.log" | tail -n 1)"
    else
      row "train_gpt $p 200 steps" FAIL "$(outcome) (train_gpt_gpu_$p.log)"; FAILED=1
    fi
  done
  SAN=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
  if [[ -x $SAN ]]; then
    rm -rf "$RES/tg_memcheck"
    step memcheck 120 "$SAN" --tool memcheck --error-exitcode 9 \
      "${TG}_cuda" --device cuda --precision bf16 --steps 3 --sample-chars 4 --eval-batches 1 \
      --out "$RES/tg_memcheck"
    if ((RC == 0)); then row "memcheck train_gpt" ok "3 bf16 steps, no error"; else
      row "memcheck train_gpt" FAIL "$(outcome) (memcheck.log)"; FAILED=1; fi
  else
    row "memcheck train_gpt" none "no compute-sanitizer in PATH or $CUDA_HOME/bin"
  fi
else
  row "train_gpt on the GPU" FAIL "$TG or ${TG}_cuda was not built"
  FAILED=1
fi

# ---- GPU benchmarks -----------------------------------------------------------------------------
if [[ -z $BENCH_NAMES ]]; then
  row "bench/run gpu" none "no GPU benchmark selected (TRAINKIT_GPU_CHECK_BENCH) or none exists"
else
  wait "$BENCH_BUILD_PID" || echo "gpu_check: bench/run --build-only failed (bench_build.log)" >&2
  add_lib_dirs bench/out/*/*  # the benchmarks' workers link cudart and cuBLASLt without an rpath
  # e2e_gpu runs the train_gpt_cuda built above (else it would compile its own, for minutes)
  [[ -x $BUILD/examples/train_gpt_cuda ]] &&
    export TRAINKIT_TRAIN_GPT_CUDA=${TRAINKIT_TRAIN_GPT_CUDA:-$(cd "$BUILD/examples" &&
      pwd)/train_gpt_cuda}
  # shellcheck disable=SC2086
  step bench "$(left)" bench/run $BENCH_NAMES
  while IFS= read -r line; do row "bench ${line%%:*}" ok "${line#*: }"; done \
    < <(grep -E '^[a-z0-9_]+: [0-9]+(\.[0-9]+)?x ' "$RES/bench.log" | sort -u)
  if ((RC != 0)); then
    row "bench/run gpu" FAIL "$(outcome): $(grep -m1 'FAILED' "$RES/bench.log") (bench.log)"
    FAILED=1
  fi
  for b in $BENCH_NAMES; do  # each benchmark without its result line, and bench/run's reason
    [[ -f bench/$b/bench.conf ]] || continue
    grep -qE "^$b: [0-9]+(\.[0-9]+)?x " "$RES/bench.log" && continue
    why=$(grep -E "^bench/run: ($b |building .*/$b/)" "$RES/bench.log" | tail -n 1)
    first=$(awk -v b="$b" '$0 ~ "^== " b ": " {on = 1; next} /^== [a-z0-9_]+: / {on = 0} on' \
      "$RES/bench.log" | grep -v '^terminate called' | grep -m1 -iE 'error|failed|timed out' |
      cut -c1-150)
    row "bench $b" FAIL \
      "${why:-no result line: $(outcome)}${first:+; first error: $first} (bench.log)"
    FAILED=1
  done
fi

say ""
say "total: $((SECONDS - START)) s of a ${BUDGET} s budget; logs in $RES"
exit "$FAILED"
