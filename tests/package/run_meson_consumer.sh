#!/usr/bin/env bash
# Builds and runs the Meson consumer with the checkout as subprojects/trainkit (a symlink).
#   run_meson_consumer.sh MESON REPO_DIR TEST_SOURCE_DIR CONSUMER_DIR WORK_DIR [meson setup args...]
set -euo pipefail
meson=$1 repo=$2 test_source=$3 consumer=$4 work=$5
shift 5
rm -rf "$work"
mkdir -p "$work/src/subprojects"
cp "$test_source/meson.build" "$test_source/meson_options.txt" "$consumer/main.cpp" "$work/src/"
ln -s "$repo" "$work/src/subprojects/trainkit"
"$meson" setup "$work/build" "$work/src" --force-fallback-for=trainkit "$@"
"$meson" compile -C "$work/build"
echo "+ $work/build/consumer"
"$work/build/consumer"
