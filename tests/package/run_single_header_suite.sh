#!/usr/bin/env bash
# Configures a nested build of this repository against single_include/ in the CPU tier
# (every backend OFF) and runs its cpu-labelled tests: the whole CPU suite, once, on the
# amalgamation. The nested build directory is kept between runs (incremental rebuilds). It builds
# at -Og: what it checks is that the amalgamation behaves as the headers do, not speed, and -Og
# compiles these tests about twice as fast as the parent's -O3.
#   run_single_header_suite.sh REPO_DIR WORK_DIR [cmake args...]
set -euo pipefail
repo=$1 work=$2
shift 2
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
cmake -S "$repo" -B "$work" "$@" \
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-Og -DNDEBUG" \
  -DTRAINKIT_USE_SINGLE_HEADER=ON \
  -DTRAINKIT_ENABLE_CUDA=OFF -DTRAINKIT_ENABLE_CUBLASLT=OFF -DTRAINKIT_ENABLE_NCCL=OFF \
  -DTRAINKIT_ENABLE_MPI=OFF -DTRAINKIT_ENABLE_BLAS=OFF -DTRAINKIT_ENABLE_OPENMP=OFF \
  -DTRAINKIT_BUILD_EXAMPLES=OFF -DTRAINKIT_INSTALL=OFF \
  -DTRAINKIT_HEADER_TESTS=OFF -DTRAINKIT_PACKAGE_TESTS=OFF \
  "-DTRAINKIT_TEST_AREAS=${TRAINKIT_SINGLE_HEADER_SUITE_AREAS:-smoke;core;exec;io;optim}"
cmake --build "$work" --parallel "$jobs"
ctest --test-dir "$work" -L cpu --output-on-failure --parallel "$jobs"
