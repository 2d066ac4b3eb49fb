#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generate single_include/trainkit/trainkit.hpp from include/trainkit/trainkit.hpp.

Starting at the umbrella header, every `#include "trainkit/..."` or `#include <trainkit/...>` that
resolves under include/ is replaced by the file's text, each file once (first occurrence), with its
`#pragma once` removed and `// begin trainkit/x.hpp` / `// end trainkit/x.hpp` breadcrumbs around
it. Every other include is kept as written. The output depends only on the input files (no dates,
no git), so regenerating an unchanged tree gives the same bytes.

Because each file is inlined only once, a trainkit include inside an #if block cannot stay where
it is (the file would vanish wherever that condition is false). Such an include is hoisted: the
header is inlined, unconditionally, just before the file that includes it. That is safe because
every trainkit header compiles alone in every tier and guards its own body (docs/design.md). The
umbrella itself must include everything unconditionally (hoisting there would leave its guard).

Usage:
  python3 tools/amalgamate.py                 write single_include/trainkit/trainkit.hpp
  python3 tools/amalgamate.py --check         exit 1 if the committed file is stale
  python3 tools/amalgamate.py -o FILE         write elsewhere (tests)
  python3 tools/amalgamate.py --unreachable   list public headers the umbrella does not reach
"""

import argparse
import difflib
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE_DIR = ROOT / "include"
UMBRELLA = "trainkit/trainkit.hpp"
OUTPUT = ROOT / "single_include" / "trainkit" / "trainkit.hpp"

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
PRAGMA_ONCE_RE = re.compile(r"^\s*#\s*pragma\s+once\b")
IF_RE = re.compile(r"^\s*#\s*(if|ifdef|ifndef)\b")
ENDIF_RE = re.compile(r"^\s*#\s*endif\b")
GUARD_IFNDEF_RE = re.compile(r"^\s*#\s*ifndef\s+(\w+)")
GUARD_DEFINE_RE = re.compile(r"^\s*#\s*define\s+(\w+)\s*$")
VERSION_RE = re.compile(r"^#define TRAINKIT_VERSION_(MAJOR|MINOR|PATCH) (\d+)", re.M)


class AmalgamationError(Exception):
  pass


def read_text(path: pathlib.Path) -> str:
  # Normalize line endings so a checkout with CRLF produces the same output.
  return path.read_text(encoding="utf-8").replace("\r\n", "\n")


def guard_depth(lines):
  """1 if the file starts with a classic `#ifndef G` / `#define G` include guard, else 0."""
  directives = [l for l in lines if l.lstrip().startswith("#")]
  if len(directives) >= 2:
    m1, m2 = GUARD_IFNDEF_RE.match(directives[0]), GUARD_DEFINE_RE.match(directives[1])
    if m1 and m2 and m1.group(1) == m2.group(1):
      return 1
  return 0


def trainkit_include(line, rel):
  """The include target under include/ if `line` includes a trainkit header, else None."""
  m = INCLUDE_RE.match(line)
  if not m:
    return None
  kind, target = m.group(1), m.group(2).strip()
  if target.startswith("trainkit/"):
    if not (INCLUDE_DIR / target).is_file():
      raise AmalgamationError(f"include/{rel}: includes <{target}>, which does not exist under include/")
    return target
  if kind == '"':
    raise AmalgamationError(
        f'include/{rel}: `#include "{target}"` - write trainkit includes as "trainkit/..." '
        "(relative includes cannot be resolved in the single header)")
  return None


class Amalgamator:
  def __init__(self):
    self.done = set()
    self.out = []

  @staticmethod
  def scan(rel, is_root):
    """Yields (line number, line, trainkit target or None, inside an #if block) for a file."""
    lines = read_text(INCLUDE_DIR / rel).split("\n")
    if lines and lines[-1] == "":
      lines.pop()
    base = guard_depth(lines) if is_root else 0
    depth = 0
    for number, line in enumerate(lines, start=1):
      if IF_RE.match(line):
        depth += 1
      elif ENDIF_RE.match(line):
        depth -= 1
      yield number, line, trainkit_include(line, rel), depth > base

  def inline(self, rel, is_root=False):
    self.done.add(rel)
    scanned = list(self.scan(rel, is_root))
    # Conditional trainkit includes first, unconditionally, before this file (see module doc).
    for number, line, target, conditional in scanned:
      if target is not None and conditional:
        if is_root:
          raise AmalgamationError(
              f"include/{rel}:{number}: `{line.strip()}` is inside an #if block; the umbrella "
              "includes every header unconditionally (each header guards its own body)")
        if target not in self.done:
          self.inline(target)
    if not is_root:
      self.out.append(f"// begin {rel}")
    for number, line, target, conditional in scanned:
      if target is not None:
        if target not in self.done:
          self.inline(target)
        continue
      if not is_root and PRAGMA_ONCE_RE.match(line):
        continue
      self.out.append(line)
    if not is_root:
      self.out.append(f"// end {rel}")


def version_string():
  text = read_text(INCLUDE_DIR / "trainkit" / "version.hpp")
  parts = dict(VERSION_RE.findall(text))
  if set(parts) != {"MAJOR", "MINOR", "PATCH"}:
    raise AmalgamationError("include/trainkit/version.hpp: TRAINKIT_VERSION_MAJOR/MINOR/PATCH not found")
  return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"


def amalgamate():
  """Returns (text, set of inlined headers relative to include/)."""
  a = Amalgamator()
  a.inline(UMBRELLA, is_root=True)
  banner = [
      "// SPDX-License-Identifier: MIT",
      f"// trainkit {version_string()} single header: all of include/trainkit in one file.",
      "// GENERATED by tools/amalgamate.py from include/ \u2014 do not edit.",
      "// Regenerate with: python3 tools/amalgamate.py",
      "",
  ]
  return "\n".join(banner + a.out) + "\n", a.done


def public_headers():
  """Every header under include/trainkit except detail/ folders, relative to include/."""
  found = []
  for path in sorted((INCLUDE_DIR / "trainkit").rglob("*")):
    if path.suffix not in (".hpp", ".h", ".cuh") or not path.is_file():
      continue
    rel = path.relative_to(INCLUDE_DIR).as_posix()
    if "detail" in rel.split("/")[:-1]:
      continue
    found.append(rel)
  return found


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--check", action="store_true",
                    help="compare with the committed single header; exit 1 when stale")
  mode.add_argument("-o", "--output", type=pathlib.Path, help=f"output file (default {OUTPUT})")
  mode.add_argument("--unreachable", action="store_true",
                    help="list public headers not reachable from the umbrella; exit 1 if any")
  args = parser.parse_args(argv)

  try:
    text, inlined = amalgamate()
  except AmalgamationError as e:
    print(f"amalgamate.py: error: {e}", file=sys.stderr)
    return 2

  if args.unreachable:
    missing = [h for h in public_headers() if h not in inlined]
    if missing:
      print(f"{len(missing)} public header(s) not reachable from include/{UMBRELLA}; add these "
            "lines to the umbrella (or move internal headers under a detail/ folder):")
      for h in missing:
        print(f'#include "{h}"')
      return 1
    print(f"all {len(public_headers())} public headers are reachable from include/{UMBRELLA}")
    return 0

  if args.check:
    current = read_text(OUTPUT) if OUTPUT.is_file() else ""
    if current == text:
      print(f"{OUTPUT.relative_to(ROOT)} is up to date")
      return 0
    diff = list(difflib.unified_diff(current.split("\n"), text.split("\n"),
                                     "committed", "regenerated", n=1, lineterm=""))
    print(f"{OUTPUT.relative_to(ROOT)} is stale ({len(diff)} diff lines; first 40 shown):")
    print("\n".join(diff[:40]))
    print(f"\nRegenerate it with:  python3 {pathlib.Path(__file__).resolve().relative_to(ROOT)}"
          f"  (from {ROOT})")
    return 1

  out = args.output or OUTPUT
  out.parent.mkdir(parents=True, exist_ok=True)
  # Rewrite only when the bytes change, so build systems watching the file see no spurious edit.
  if not out.is_file() or out.read_bytes() != text.encode("utf-8"):
    out.write_bytes(text.encode("utf-8"))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
