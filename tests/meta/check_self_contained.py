#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""meta.self_contained: the repository stands alone.

Scans every tracked text file (`git ls-files`; without git, a walk that skips .git, build*/ and
.venv*) for text that points at files outside the repository:
  - a design page named like the one in docs/ (any case) that does not resolve to a file here,
    e.g. a bare root-level name instead of docs/design.md;
  - `reference/<name>.md`, or any `<name>.md` followed by a section sign or "section N", that
    does not resolve to a file here (relative to the file's folder or to the repository root);
  - any other `<name>.md` that is no file here (a bare name may be any tracked file's name;
    GENERATED_MD lists the Markdown files that scripts write at run time);
  - paths into a folder named `shared` (below the current folder, or one going up into it), and
    absolute paths into the checkout of one machine (SHARED_RE, WORK_RE);
  - planning talk instead of facts: a task or an issue that comes later, what an issue asks for
    (PLANNING_RE).
It also checks that every local link in README.md and docs/*.md ([text](target)) names a file
or folder that exists, and that a `#fragment` on a link to a Markdown file names one of its
headings (GitHub's anchor rules).

single_include/ is scanned like everything else: it is generated from include/, so a finding
there disappears when it is regenerated after include/ is fixed.

Prints file:line: what for each finding and exits 1 if there is any.
This file is scanned too: its patterns are assembled so that they do not match their own text.
Usage: check_self_contained.py [--root DIR] [FILE...]   (FILEs relative to the root: scan only
those)
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The patterns are assembled from pieces so that this file does not match itself.
MD = r"\.md\b"
DESIGN_RE = re.compile(r"(?i)(?<![\w/.-])([\w./-]*\bdesign)" + MD)
REFERENCE_RE = re.compile(r"(?<![\w.-])((?:[\w.-]+/)*reference/[\w.-]+)" + MD)
SECTION_RE = re.compile(r"(?<![\w/.-])([\w./-]*[\w-])" + MD + r"(?:'s)?\s*(?:§|[Ss]ection\s+\d)")
ANY_MD_RE = re.compile(r"(?<![\w/.$}-])([\w./-]*[\w-])" + MD)
# Markdown files written at run time, not committed: name -> what writes it.
GENERATED_MD = {"summary.md": "tools/gpu_check.sh (the GPU results table)"}
SHARED_RE = re.compile(r"(?:\.\./shared\b|(?<![\w.-])shared/(?=[\w.-]))")
WORK_RE = re.compile(r"(?<![\w.])/wor" + r"k/")
PLANNING_RE = re.compile(
    r"(?i)\blater\s+(?:issue|ticket|PR|pull request)s?\b"
    r"|\ba\s+later\s+task\b"
    r"|\b(?:the|this|next|future|separate|follow-up|another)\s+(?:issue|ticket)(?:'s|s)?\b")

URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s)>\]\"'`]*")  # web addresses are not files
LINK_RE = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def tracked_files(root):
  try:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
    files = [f for f in out.stdout.decode("utf-8", "replace").split("\0") if f]
    if files:
      return files
  except (OSError, subprocess.CalledProcessError):
    pass
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames
                         if d != ".git" and not d.startswith("build") and not d.startswith(".venv"))
    for name in sorted(filenames):
      files.append(pathlib.Path(dirpath, name).relative_to(root).as_posix())
  return files


def read_text(path):
  """The file's text, or None for binary files (a NUL byte) and files that are not there."""
  try:
    raw = path.read_bytes()
  except OSError:
    return None
  if b"\0" in raw:
    return None
  return raw.decode("utf-8", errors="replace")


def resolves(root, rel, target):
  """True when `target` names a file or folder inside the repository, relative to the folder of
  `rel` or to the root. Case-sensitive, as on Linux: an upper-case page name does not resolve to
  the lower-case file."""
  if target.startswith("./"):
    target = target[2:]
  for base in (root / pathlib.PurePosixPath(rel).parent, root):
    candidate = (base / target).resolve()
    try:
      candidate.relative_to(root.resolve())
    except ValueError:
      continue
    if candidate.exists() and candidate.name == pathlib.PurePosixPath(target).name:
      return True
  return False


def scan_references(root, rel, text, problems, names):
  for number, line in enumerate(text.split("\n"), start=1):
    def problem(what):
      problems.append(f"{rel}:{number}: {what}")

    # Spans already reported (so one citation gives one finding) and web addresses (skipped).
    reported = [m.span() for m in URL_RE.finditer(line)]
    urls = list(reported)

    def in_url(m):
      return any(m.start() < end and start < m.end() for start, end in urls)

    def page(regex, what):
      for m in regex.finditer(line):
        if any(m.start(1) < end and start < m.end(1) for start, end in reported):
          continue
        if not resolves(root, rel, m.group(1) + ".md"):
          reported.append(m.span(1))
          problem(f"`{m.group(0).strip()}` {what}")

    page(DESIGN_RE, "is not a file of this repository: point to docs/design.md")
    page(REFERENCE_RE, "is not in this repository: state the fact or point to docs/")
    page(SECTION_RE, "cites a page that is not in this repository")
    for m in ANY_MD_RE.finditer(line):
      if any(m.start(1) < end and start < m.end(1) for start, end in reported):
        continue
      name = m.group(1) + ".md"
      if name in GENERATED_MD or ("/" not in name and name in names):
        continue
      if not resolves(root, rel, name):
        problem(f"`{name}` is not a file of this repository")
    for m in SHARED_RE.finditer(line):
      if in_url(m):
        continue
      problem(f"`{m.group(0)}` points into a folder outside this repository")
    for m in WORK_RE.finditer(line):
      if in_url(m):
        continue
      problem(f"`{m.group(0)}` is an absolute path of one machine: use a path relative to the "
              "repository")
    for m in PLANNING_RE.finditer(line):
      problem(f"`{m.group(0)}`: say what exists and what does not, not how work is planned")


def github_anchors(text):
  """The anchors GitHub gives the headings of a Markdown text (outside fenced code blocks)."""
  anchors, seen, fenced = set(), {}, False
  for line in text.split("\n"):
    if line.lstrip().startswith(("```", "~~~")):
      fenced = not fenced
      continue
    m = None if fenced else HEADING_RE.match(line)
    if not m:
      continue
    title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))  # a link's text only
    slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    anchors.add(slug if n == 0 else f"{slug}-{n}")
  return anchors


def scan_links(root, rel, text, problems):
  fenced = False
  for number, line in enumerate(text.split("\n"), start=1):
    if line.lstrip().startswith(("```", "~~~")):
      fenced = not fenced
      continue
    if fenced:
      continue
    for m in LINK_RE.finditer(re.sub(r"`[^`]*`", "", line)):
      target = m.group(1) or m.group(2)
      if SCHEME_RE.match(target) or target.startswith("//"):
        continue
      path, _, fragment = target.partition("#")
      where = root / pathlib.PurePosixPath(rel).parent
      dest = (where / path).resolve() if path else (root / rel).resolve()
      if path and not dest.exists():
        problems.append(f"{rel}:{number}: link to `{target}`: no such file in this repository")
        continue
      if fragment and dest.is_file() and dest.suffix == ".md":
        if fragment not in github_anchors(dest.read_text(encoding="utf-8", errors="replace")):
          problems.append(f"{rel}:{number}: link to `{target}`: "
                          f"{dest.relative_to(root.resolve()).as_posix()} has no heading "
                          f"`#{fragment}`")


def is_link_checked(rel):
  parts = pathlib.PurePosixPath(rel).parts
  return rel == "README.md" or (len(parts) == 2 and parts[0] == "docs" and rel.endswith(".md"))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--root", type=pathlib.Path, default=ROOT)
  parser.add_argument("files", nargs="*")
  args = parser.parse_args()
  root = args.root.resolve()
  files = args.files or tracked_files(root)
  names = {pathlib.PurePosixPath(f).name for f in tracked_files(root)}
  problems = []
  scanned = 0
  for rel in files:
    text = read_text(root / rel)
    if text is None:
      continue
    scanned += 1
    scan_references(root, rel, text, problems, names)
    if is_link_checked(rel):
      scan_links(root, rel, text, problems)
  for p in problems:
    print(p)
  print(f"{scanned} text files scanned, {len(problems)} reference(s) to outside the repository "
        "or broken link(s)")
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
