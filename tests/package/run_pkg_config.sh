#!/usr/bin/env bash
# The pkg-config path: installs the build into a fresh prefix, then compiles the consumer program
# with nothing but `pkg-config --cflags/--libs trainkit` (the CPU tier) and runs it.
#   run_pkg_config.sh BUILD_DIR PREFIX CONSUMER_MAIN CXX
set -euo pipefail
build_dir=$1 prefix=$2 main=$3 cxx=$4
rm -rf "$prefix"
cmake --install "$build_dir" --prefix "$prefix" > /dev/null
export PKG_CONFIG_PATH="$prefix/share/pkgconfig"
pkg-config --exists --print-errors trainkit
echo "+ pkg-config: $(pkg-config --modversion trainkit): $(pkg-config --cflags --libs trainkit)"
# shellcheck disable=SC2046  # the flags are words
"$cxx" -O1 -Wall -Wextra -Werror -DTRAINKIT_EXPECT_CUDA=0 -DTRAINKIT_EXPECT_MPI=0 \
  $(pkg-config --cflags trainkit) "$main" $(pkg-config --libs trainkit) -o "$prefix/consumer"
"$prefix/consumer"
