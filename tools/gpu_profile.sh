#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tools/gpu_profile.sh OUT_DIR STEPS -- COMMAND...: the GPU time of every kernel that COMMAND
# launches inside trainkit's forward/backward/optimizer NVTX ranges (train::Loop emits them), one
# Nsight Compute pass per kernel with the single metric gpu__time_duration.sum and the GPU clocks
# left as they are. Writes OUT_DIR/ncu.csv and OUT_DIR/kernels.txt (tools/kernel_times.py, totals
# divided by STEPS, the optimizer steps COMMAND runs). Every kernel runs serialised under ncu, so
# the sum is the kernels' own time, without launch gaps or overlap.
set -uo pipefail
[[ $# -ge 4 && $3 == -- ]] || { echo "usage: tools/gpu_profile.sh OUT_DIR STEPS -- COMMAND..." >&2; exit 2; }
out=$1 steps=$2
shift 3
mkdir -p "$out" || exit 2
NCU=${NCU:-$(command -v ncu || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")}
command -v "$NCU" > /dev/null ||
  { echo "gpu_profile: no Nsight Compute at $NCU (set NCU or CUDA_HOME)" >&2; exit 2; }
ncu_run() {
  "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --print-units base --print-kernel-base function "$@" > "$out/command.log" 2>&1
}
ncu_run --nvtx --nvtx-include 'forward/' --nvtx-include 'backward/' --nvtx-include 'optimizer/' \
  --log-file "$out/ncu.csv" "$@"
rc=$?
if ! grep -q gpu__time_duration "$out/ncu.csv" 2> /dev/null; then
  echo "gpu_profile: no kernel inside the NVTX phase ranges; profiling every kernel" >&2
  ncu_run --log-file "$out/ncu.csv" "$@"
  rc=$?
fi
((rc == 0)) || echo "gpu_profile: ncu or the command failed (status $rc): see $out/command.log" >&2
if [[ -f $out/ncu.csv ]]; then
  python3 "$(dirname "${BASH_SOURCE[0]}")/kernel_times.py" "$out/ncu.csv" --per "$steps" \
    | tee "$out/kernels.txt"
fi
exit $rc
