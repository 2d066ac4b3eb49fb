#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""meta.version: every place that states trainkit's version agrees with include/trainkit/version.hpp.

Checks: MAJOR/MINOR/PATCH vs TRAINKIT_VERSION_STRING; the inline namespace v<MAJOR>_<MINOR> in
TRAINKIT_NAMESPACE_BEGIN; CMake's PROJECT_VERSION (--cmake-version); project(version:) in
meson.build; the banner of single_include/trainkit/trainkit.hpp.
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--cmake-version", help="PROJECT_VERSION as CMake parsed it")
  args = parser.parse_args()
  errors = []

  header = (ROOT / "include/trainkit/version.hpp").read_text(encoding="utf-8")
  parts = dict(re.findall(r"^#define TRAINKIT_VERSION_(MAJOR|MINOR|PATCH) (\d+)\s*$", header, re.M))
  if set(parts) != {"MAJOR", "MINOR", "PATCH"}:
    print("include/trainkit/version.hpp: TRAINKIT_VERSION_MAJOR/MINOR/PATCH not all found")
    return 1
  version = f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
  print(f"version.hpp says {version}")

  m = re.search(r'^#define TRAINKIT_VERSION_STRING "([^"]*)"', header, re.M)
  if not m or m.group(1) != version:
    errors.append(f"version.hpp: TRAINKIT_VERSION_STRING is {m.group(1) if m else 'missing'!r}, "
                  f"expected {version!r}")
  ns = f"v{parts['MAJOR']}_{parts['MINOR']}"
  if not re.search(r"inline namespace " + ns + r"\b", header):
    errors.append(f"version.hpp: TRAINKIT_NAMESPACE_BEGIN should open `inline namespace {ns}`")

  if args.cmake_version is not None and args.cmake_version != version:
    errors.append(f"CMake PROJECT_VERSION is {args.cmake_version}, expected {version}")

  meson = ROOT / "meson.build"
  if meson.is_file():
    text = meson.read_text(encoding="utf-8")
    start = text.find("project(")
    # The first `version: '...'` after project( (the lookbehind skips meson_version).
    m = re.search(r"(?<!\w)version\s*:\s*'([^']*)'", text[start:]) if start >= 0 else None
    if not m:
      errors.append("meson.build: project(... version: 'X.Y.Z' ...) not found")
    elif m.group(1) != version:
      errors.append(f"meson.build: project version is {m.group(1)}, expected {version} "
                    "(edit meson.build's project() call)")

  single = ROOT / "single_include/trainkit/trainkit.hpp"
  if single.is_file():
    m = re.search(r"^// trainkit (\S+) single header", single.read_text(encoding="utf-8"), re.M)
    if not m or m.group(1) != version:
      errors.append(f"single_include/trainkit/trainkit.hpp: banner version is "
                    f"{m.group(1) if m else 'missing'}, expected {version} "
                    "(run python3 tools/amalgamate.py)")

  for e in errors:
    print("error:", e)
  if not errors:
    print("all version statements agree")
  return 1 if errors else 0


if __name__ == "__main__":
  sys.exit(main())
