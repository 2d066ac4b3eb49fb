#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""meta.format: the headers, tests, examples and benchmarks follow .clang-format.

Runs `clang-format --dry-run --Werror` on every C++/CUDA file under include/, tests/, examples/
and bench/ (generated and third-party files excluded) and lists the files that differ.
Fix them with:  clang-format -i <file>...
"""
import argparse
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = ("include", "tests", "examples", "bench")
SUFFIXES = {".hpp", ".h", ".cuh", ".cpp", ".cc", ".cu"}
SKIP_PARTS = {"thirdparty", "third_party", "data"}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--clang-format", default="clang-format")
  args = parser.parse_args()
  files = []
  for folder in FOLDERS:
    for path in sorted((ROOT / folder).rglob("*")):
      rel = path.relative_to(ROOT)
      if path.is_file() and path.suffix in SUFFIXES and not SKIP_PARTS & set(rel.parts):
        files.append(path)
  bad = []
  for path in files:
    result = subprocess.run([args.clang_format, "--dry-run", "--Werror", str(path)],
                            cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
      bad.append((path.relative_to(ROOT).as_posix(), result.stderr.count("-Wclang-format-violations")))
  for rel, n in bad:
    print(f"{rel}: {n} place(s) differ from .clang-format")
  print(f"{len(files)} files checked, {len(bad)} not formatted")
  if bad:
    print("fix with:  clang-format -i " + " ".join(rel for rel, _ in bad))
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
