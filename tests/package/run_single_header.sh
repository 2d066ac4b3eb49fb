#!/usr/bin/env bash
# Compiles the consumer with nothing but one compiler command and -I single_include, then runs it.
#   run_single_header.sh REPO_DIR CONSUMER_SOURCE WORK_DIR COMPILER [flags...]
set -euo pipefail
repo=$1 source=$2 work=$3 compiler=$4
shift 4
rm -rf "$work"
mkdir -p "$work"
set -x
"$compiler" "$@" -I "$repo/single_include" "$source" -o "$work/consumer"
"$work/consumer"
