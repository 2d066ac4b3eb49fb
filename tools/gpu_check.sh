#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tools/gpu_check.sh [results-dir]: everything trainkit checks on an NVIDIA GPU, in one short run
# (< 8 minutes): configures the CUDA tier for sm_90 in build-gpu/, builds, runs the ctest labels
# `cuda` and `nccl`, then the GPU benchmarks (`bench/run gpu`: names ending in _gpu or gpu = 1 in
# their bench.conf). Prints a table and writes it, with every log, to results-dir (default $OUT,
# else ./gpu-results). Exit: 0 all passed, 1 something failed, 2 no usable GPU/toolchain here.
# Environment: TRAINKIT_GPU_CHECK_BUDGET (seconds, default 470), TRAINKIT_GPU_CHECK_BUILD_DIR
#   (default build-gpu), CUDA_HOME (default /usr/local/cuda),
#   TRAINKIT_BENCH_PYTHON (Python with torch for benchmark peers; by default .venv-bench, else a
#   python3 that imports torch; nothing is downloaded).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
RES=${1:-${OUT:-$ROOT/gpu-results}}
mkdir -p "$RES" || { echo "gpu_check: cannot create results folder $RES" >&2; exit 2; }
RES=$(cd "$RES" && pwd)
BUDGET=${TRAINKIT_GPU_CHECK_BUDGET:-470}
BUILD=${TRAINKIT_GPU_CHECK_BUILD_DIR:-build-gpu}
TABLE="$RES/summary.md"
START=$SECONDS
FAILED=0

: > "$TABLE"
say() { echo "$*" | tee -a "$TABLE"; }
row() { printf '| %-24s | %-7s | %s |\n' "$1" "$2" "$3" | tee -a "$TABLE"; }
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
command -v nvcc > /dev/null || no_gpu "nvcc not found (looked in PATH and $CUDA_HOME/bin)."
command -v cmake > /dev/null || no_gpu "cmake not found."
GEN=(); command -v ninja > /dev/null && GEN=(-G Ninja)
JOBS=$(nproc)

GPU=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
  2> /dev/null | head -n 1)
say "# trainkit GPU check"
say ""
say "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $(git rev-parse --short HEAD 2> /dev/null || echo '?')$( \
  [[ -n $(git status --porcelain 2> /dev/null) ]] && echo ' (+ uncommitted changes)')"
say "- GPU: $GPU ($(grep -c '^GPU ' "$RES/nvidia-smi-L.txt") visible)"
say "- nvcc: $(nvcc --version | grep -o 'release [0-9.]*' | head -n 1); host: $(grep -m1 'model name' \
  /proc/cpuinfo | cut -d: -f2 | xargs), $JOBS cores"
say ""
row step result details
row "------------------------" "-------" "-------"

# ---- configure + build --------------------------------------------------------------------------
step configure 120 cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DTRAINKIT_ENABLE_CUDA=ON -DTRAINKIT_BUILD_TESTS=ON
if ((RC == 0)); then
  row configure ok "$(grep -m1 -o 'backends: .*' "$RES/configure.log")"
else
  row configure FAIL "status $RC, see configure.log: $(grep -m1 -i 'error' "$RES/configure.log" |
    cut -c1-100)"
  FAILED=1
fi

if ((RC == 0)); then
  KEEP=(); [[ ${#GEN[@]} -gt 0 ]] && KEEP=(-- -k 0)  # build what compiles, report the rest
  step build 300 cmake --build "$BUILD" -j "$JOBS" "${KEEP[@]}"
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
    if [[ $summary == *"No tests were found"* ]]; then
      row "ctest -L $label" none "no test has this label"
    elif ((RC == 0)); then
      row "ctest -L $label" ok "$summary; $(grep -c '(Skipped)' "$log") skipped (exit 77)"
    else
      failed=$(sed -n '/following tests FAILED/,$p' "$log" | grep -E '^\s+[0-9]+ - ' |
        awk '{print $3}' | tr '\n' ' ')
      row "ctest -L $label" FAIL "$(outcome): ${summary:-no summary}; failed: ${failed:-?} ($log)"
      FAILED=1
    fi
  done
fi

# ---- GPU benchmarks -----------------------------------------------------------------------------
if [[ -z ${TRAINKIT_BENCH_PYTHON:-} && ! -x .venv-bench/bin/python ]]; then
  export TRAINKIT_BENCH_NO_INSTALL=1  # a GPU box may be offline: never try to download torch
  python3 -c 'import torch' 2> /dev/null && export TRAINKIT_BENCH_PYTHON=python3
fi
names=$(bench/run --list | awk 'NR > 1 && $2 == "gpu" {print $1}' | tr '\n' ' ')
if [[ -z $names ]]; then
  row "bench/run gpu" none "no GPU benchmark exists yet"
else
  step bench "$(left)" bench/run gpu
  while IFS= read -r line; do row "bench ${line%%:*}" ok "${line#*: }"; done \
    < <(grep -E '^[a-z0-9_]+: [0-9]+(\.[0-9]+)?x ' "$RES/bench.log" | sort -u)
  if ((RC != 0)); then
    row "bench/run gpu" FAIL "$(outcome): $(grep -m1 'FAILED' "$RES/bench.log") (bench.log)"
    FAILED=1
  fi
fi

say ""
say "total: $((SECONDS - START)) s of a ${BUDGET} s budget; logs in $RES"
exit "$FAILED"
