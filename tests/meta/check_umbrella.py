#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""meta.umbrella_index: include/trainkit/trainkit.hpp is the index of the library.

  - every public header under include/trainkit (headers inside a detail/ folder are internal and
    left out) is included by the umbrella, directly and exactly once;
  - the umbrella includes no header that does not exist;
  - the line above each include is a `// defines: <names>` note with at least one name;
  - the includes of one folder stand together (the umbrella is grouped by folder), the top-level
    headers first.
Prints one line per problem (file:line: what) and exits 1 if there is any.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"
UMBRELLA = "trainkit/trainkit.hpp"

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"(trainkit/[^"]+)"')
DEFINES_RE = re.compile(r"^// defines: \S")


def public_headers():
  out = set()
  for path in (INCLUDE / "trainkit").rglob("*.hpp"):
    rel = path.relative_to(INCLUDE)
    if "detail" in rel.parts[:-1] or rel.as_posix() == UMBRELLA:
      continue
    out.add(rel.as_posix())
  return out


def folder(header):
  parts = header.split("/")
  return parts[1] if len(parts) > 2 else ""  # "" = the top-level headers


def check(lines, headers):
  problems = []

  def problem(line, what):
    problems.append(f"include/{UMBRELLA}:{line}: {what}")

  seen = {}
  folders_done = []  # folders in the order their includes appear
  for number, line in enumerate(lines, start=1):
    m = INCLUDE_RE.match(line)
    if not m:
      continue
    header = m.group(1)
    if header in seen:
      problem(number, f"{header} is included again (first at line {seen[header]})")
      continue
    seen[header] = number
    if header not in headers:
      problem(number, f"{header} is not a public header of include/ (removed, or under detail/)")
    previous = lines[number - 2] if number >= 2 else ""
    if not DEFINES_RE.match(previous):
      problem(number, f"{header} lacks its `// defines: ...` line directly above the include")
    f = folder(header)
    if not folders_done or folders_done[-1] != f:
      if f in folders_done:
        problem(number, f"{header}: the includes of {f or 'the top level'}/ are not together")
      folders_done.append(f)
  if folders_done and folders_done[0] != "":
    problems.append(f"include/{UMBRELLA}: the top-level headers do not come first")
  for header in sorted(headers - set(seen)):
    problems.append(f"include/{UMBRELLA}: {header} is not included (add it with a "
                    "`// defines: ...` line, in its folder's group)")
  return problems


def main():
  lines = (INCLUDE / UMBRELLA).read_text(encoding="utf-8").splitlines()
  problems = check(lines, public_headers())
  for p in problems:
    print(p)
  if problems:
    print(f"{len(problems)} problem(s) in the umbrella index")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
