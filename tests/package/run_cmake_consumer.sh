#!/usr/bin/env bash
# Configures, builds and runs one CMake consumer project from scratch (packaging tests).
#   run_cmake_consumer.sh [--install BUILD_DIR PREFIX] SOURCE_DIR WORK_DIR [cmake args...]
# --install first runs `cmake --install BUILD_DIR --prefix PREFIX` (the find_package test).
set -euo pipefail
if [[ ${1:-} == --install ]]; then
  build_dir=$2 prefix=$3
  shift 3
  rm -rf "$prefix"
  cmake --install "$build_dir" --prefix "$prefix"
fi
source_dir=$1 work=$2
shift 2
rm -rf "$work"
cmake -S "$source_dir" -B "$work" "$@"
cmake --build "$work" --parallel "${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
for exe in "$work"/consumer "$work"/consumer_cuda "$work"/consumer_cpu "$work"/app; do
  if [[ -x $exe ]]; then
    echo "+ $exe"
    "$exe"
  fi
done
# A consumer of the CPU target links no backend library, even where they are installed.
for exe in "$work"/consumer_cpu "$work"/app; do
  if [[ -x $exe ]] && command -v ldd > /dev/null; then
    if ldd "$exe" | grep -E 'libcudart|libcublas|libnccl|libmpi|libgomp|libopenblas|libcblas'; then
      echo "run_cmake_consumer.sh: $exe (trainkit::trainkit only) links the backend libraries above" >&2
      exit 1
    fi
  fi
done
