#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""meta.conventions: mechanical checks of the header conventions (docs/design.md, "Conventions").

For every file under include/:
  - only headers (.hpp/.h/.cuh): the library is header-only;
  - line 1 is `// SPDX-License-Identifier: MIT`, followed by a comment saying what the file is;
  - `#pragma once` (the umbrella instead has its classic include guard);
  - every macro it #defines starts with TRAINKIT_;
  - capability macros are tested with `#if TRAINKIT_WITH_X`, never #ifdef/#ifndef/defined(), and
    __CUDACC__ is read in config.hpp only (elsewhere: TRAINKIT_CUDA_COMPILER) - outside config.hpp;
  - no `using namespace` at file level in a header;
  - no tabs, no CRLF (the 100-column limit and the rest of the layout: meta.format).
Prints one line per problem (file:line: what) and exits 1 if there is any.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"
UMBRELLA = "trainkit/trainkit.hpp"
CONFIG = "trainkit/config.hpp"

DEFINE_RE = re.compile(r"^\s*#\s*define\s+(\w+)")
CAPABILITY = r"TRAINKIT_(?:WITH_\w+|CUDA_COMPILER)\b"
IFDEF_CAP_RE = re.compile(r"^\s*#\s*(?:ifdef|ifndef)\s+" + CAPABILITY)
DEFINED_CAP_RE = re.compile(r"^\s*#\s*(?:el)?if\b.*\bdefined\s*\(?\s*" + CAPABILITY)
CUDACC_RE = re.compile(r"\b__CUDACC__\b")
USING_NS_RE = re.compile(r"^using\s+namespace\b")


def check(path, rel, problems):
  def problem(line, what):
    problems.append(f"include/{rel}:{line}: {what}")

  raw = path.read_bytes()
  if b"\r\n" in raw:
    problem(1, "CRLF line endings")
  text = raw.decode("utf-8", errors="replace")
  lines = text.split("\n")
  if not lines or lines[0].strip() != "// SPDX-License-Identifier: MIT":
    problem(1, "first line must be `// SPDX-License-Identifier: MIT`")
  if len(lines) < 2 or not lines[1].startswith("//"):
    problem(2, "after the SPDX line, 2-6 comment lines saying what the file provides and why")
  if rel == UMBRELLA:
    if not re.search(r"^#ifndef TRAINKIT_TRAINKIT_HPP_\s*$", text, re.M):
      problem(1, "the umbrella keeps its classic include guard TRAINKIT_TRAINKIT_HPP_")
  elif not re.search(r"^#pragma once\s*$", text, re.M):
    problem(1, "missing `#pragma once`")

  in_block_comment = False
  for number, line in enumerate(lines, start=1):
    if "\t" in line:
      problem(number, "tab character (indent with 2 spaces)")
    stripped = line.strip()
    # Skip the body of /* ... */ comments for the preprocessor checks below.
    if in_block_comment:
      if "*/" in stripped:
        in_block_comment = False
      continue
    if stripped.startswith("/*") and "*/" not in stripped:
      in_block_comment = True
      continue
    if stripped.startswith("//"):
      continue
    m = DEFINE_RE.match(line)
    if m and not m.group(1).startswith("TRAINKIT_"):
      problem(number, f"macro `{m.group(1)}` must be prefixed TRAINKIT_ (TRAINKIT_DETAIL_ if internal)")
    if rel != CONFIG:
      if IFDEF_CAP_RE.match(line) or DEFINED_CAP_RE.match(line):
        problem(number, "test capability macros with `#if TRAINKIT_WITH_X` (they are always "
                        "defined, 0 or 1), not #ifdef / defined()")
      code = line.split("//", 1)[0]
      if CUDACC_RE.search(code):
        problem(number, "use TRAINKIT_CUDA_COMPILER instead of __CUDACC__ (decided in config.hpp)")
    if USING_NS_RE.match(line):
      problem(number, "`using namespace` at file scope in a header leaks into every includer")


def main():
  problems = []
  for path in sorted(INCLUDE.rglob("*")):
    if not path.is_file():
      continue
    rel = path.relative_to(INCLUDE).as_posix()
    if path.suffix not in (".hpp", ".h", ".cuh"):
      problems.append(f"include/{rel}: not a header; the library is header-only")
      continue
    check(path, rel, problems)
  for p in problems:
    print(p)
  count = len(list(INCLUDE.rglob("*.hpp")))
  print(f"{count} headers checked, {len(problems)} problem(s)")
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
